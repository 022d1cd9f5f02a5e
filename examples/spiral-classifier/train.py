"""Train a small MLP on a noisy three-arm spiral, with NumPy only.

A real (if tiny) training job in the shape the control plane expects:

- it logs one line per logging step: ``step 40/200 train_loss=... eval_loss=... eval_acc=...``;
- every ``--checkpoint-every`` steps it writes ``checkpoint-<step>/`` into
  ``$FLEXAI_OUTPUT_CHECKPOINT_DIR`` in the Hugging Face layout (``trainer_state.json``,
  ``config.json``, weights), atomically: a half-written checkpoint is never visible;
- at the end it writes the final model and its metrics into ``$FLEXAI_OUTPUT_DIR``;
- if ``$FLEXAI_INPUT_CHECKPOINT_DIR`` holds a ``model.npz`` it resumes from it.

Run by hand it writes into ./output and ./output-checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

MODEL_NAME = "NumpyMLPClassifier"
MODEL_TYPE = "numpy-mlp"
CLASSES = ("arm-0", "arm-1", "arm-2")
Params = dict[str, np.ndarray]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    parser.add_argument("--lr", type=float, default=0.005, help="Adam learning rate")
    parser.add_argument("--hidden", type=int, default=384, help="width of both hidden layers")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=120_000, help="dataset size (all classes)")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="0: no checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "hidden", "batch_size", "samples", "log_every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 or positive")
    return args


def make_spiral(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three interleaved noisy spiral arms in 2-D; the noise caps the accuracy near 95%."""
    rng = np.random.default_rng(seed)
    per_class = samples // len(CLASSES)
    points, labels = [], []
    for label in range(len(CLASSES)):
        radius = rng.uniform(0.05, 1.0, per_class)
        angle = 2 * np.pi * label / len(CLASSES) + 1.75 * np.pi * radius
        angle += rng.normal(0.0, 0.5, per_class)
        points.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        labels.append(np.full(per_class, label))
    x = np.concatenate(points).astype(np.float32)
    y = np.concatenate(labels)
    order = rng.permutation(len(y))
    return x[order], y[order]


def init_params(hidden: int, seed: int) -> Params:
    rng = np.random.default_rng(seed + 1)
    shapes = {"w1": (2, hidden), "w2": (hidden, hidden), "w3": (hidden, len(CLASSES))}
    params: Params = {}
    for index, (name, shape) in enumerate(shapes.items(), start=1):
        params[name] = (rng.normal(0.0, 1.0, shape) / np.sqrt(shape[0])).astype(np.float32)
        params[f"b{index}"] = np.zeros(shape[1], dtype=np.float32)
    return params


def forward(params: Params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    h1 = np.tanh(x @ params["w1"] + params["b1"])
    h2 = np.tanh(h1 @ params["w2"] + params["b2"])
    logits = h2 @ params["w3"] + params["b3"]
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return h1, h2, exp / exp.sum(axis=1, keepdims=True)


def cross_entropy(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())


def gradients(params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
    h1, h2, probs = forward(params, x)
    loss = cross_entropy(probs, y)
    d_logits = probs
    d_logits[np.arange(len(y)), y] -= 1.0
    d_logits /= len(y)
    d_h2 = (d_logits @ params["w3"].T) * (1.0 - h2**2)
    d_h1 = (d_h2 @ params["w2"].T) * (1.0 - h1**2)
    grads = {
        "w3": h2.T @ d_logits,
        "b3": d_logits.sum(axis=0),
        "w2": h1.T @ d_h2,
        "b2": d_h2.sum(axis=0),
        "w1": x.T @ d_h1,
        "b1": d_h1.sum(axis=0),
    }
    return loss, grads


def evaluate(params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    _, _, probs = forward(params, x)
    return cross_entropy(probs, y), float((probs.argmax(axis=1) == y).mean())


class Adam:
    def __init__(self, params: Params, lr: float, state: Params | None = None) -> None:
        self.lr = lr
        zeros = {name: np.zeros_like(value) for name, value in params.items()}
        self.m = {n: state[f"m.{n}"] for n in params} if state else dict(zeros)
        self.v = {n: state[f"v.{n}"] for n in params} if state else dict(zeros)

    def update(self, params: Params, grads: Params, step: int) -> None:
        beta1, beta2 = 0.9, 0.999
        for name, grad in grads.items():
            self.m[name] = beta1 * self.m[name] + (1 - beta1) * grad
            self.v[name] = beta2 * self.v[name] + (1 - beta2) * grad * grad
            m_hat = self.m[name] / (1 - beta1**step)
            v_hat = self.v[name] / (1 - beta2**step)
            params[name] -= (self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(np.float32)

    def state(self) -> Params:
        return {
            **{f"m.{n}": a for n, a in self.m.items()},
            **{f"v.{n}": a for n, a in self.v.items()},
        }


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "architectures": [MODEL_NAME],
        "model_type": MODEL_TYPE,
        "input_size": 2,
        "hidden_size": args.hidden,
        "num_hidden_layers": 2,
        "hidden_act": "tanh",
        "num_labels": len(CLASSES),
        "id2label": {str(i): name for i, name in enumerate(CLASSES)},
        "label2id": {name: i for i, name in enumerate(CLASSES)},
        "framework": "numpy",
        "numpy_version": np.__version__,
    }


def write_model(directory: Path, params: Params, config: dict[str, Any]) -> None:
    np.savez(directory / "model.npz", **cast(dict[str, Any], params))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def save_checkpoint(
    root: Path,
    step: int,
    params: Params,
    optimizer: Adam,
    config: dict[str, Any],
    state: dict[str, Any],
) -> Path:
    """Write ``root/checkpoint-<step>/`` through a hidden temporary directory and a rename."""
    final = root / f"checkpoint-{step}"
    scratch = root / f".checkpoint-{step}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    write_model(scratch, params, config)
    np.savez(scratch / "optimizer.npz", **cast(dict[str, Any], optimizer.state()))
    (scratch / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
    if final.exists():  # a rerun by hand over an old output directory
        shutil.rmtree(final)
    os.rename(scratch, final)  # atomic: the checkpoint appears whole or not at all
    return final


def find_input_checkpoint() -> Path | None:
    """The directory under ``$FLEXAI_INPUT_CHECKPOINT_DIR`` that holds ``model.npz``."""
    root = os.environ.get("FLEXAI_INPUT_CHECKPOINT_DIR")
    if not root or not Path(root).is_dir():
        return None
    base = Path(root)
    if (base / "model.npz").is_file():
        return base
    nested = sorted(base.glob("*/model.npz"), key=lambda p: (len(p.parent.name), p.parent.name))
    return nested[-1].parent if nested else None  # the highest checkpoint-<step> if several


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output_dir = Path(os.environ.get("FLEXAI_OUTPUT_DIR") or "output")
    checkpoint_dir = Path(os.environ.get("FLEXAI_OUTPUT_CHECKPOINT_DIR") or "output-checkpoint")
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)

    resume = find_input_checkpoint()
    if resume is not None and (resume / "config.json").is_file():
        hidden = json.loads((resume / "config.json").read_text()).get("hidden_size")
        if isinstance(hidden, int) and hidden != args.hidden:
            print(f"using --hidden {hidden} from the input checkpoint", flush=True)
            args.hidden = hidden

    x, y = make_spiral(args.samples, args.seed)
    n_eval = len(y) // 6
    x_eval, y_eval, x_train, y_train = x[:n_eval], y[:n_eval], x[n_eval:], y[n_eval:]
    config = model_config(args)
    params = init_params(args.hidden, args.seed)
    optimizer = Adam(params, args.lr)
    log_history: list[dict[str, Any]] = []
    start_step = 0

    if resume is not None:
        with np.load(resume / "model.npz") as weights:
            loaded = {name: weights[name].astype(np.float32) for name in weights.files}
        if set(loaded) != set(params) or any(loaded[n].shape != params[n].shape for n in params):
            print(f"error: {resume}/model.npz does not fit --hidden {args.hidden}", file=sys.stderr)
            return 2
        params = loaded
        state_file = resume / "trainer_state.json"
        if state_file.is_file():
            previous = json.loads(state_file.read_text())
            start_step = int(previous.get("global_step", 0))
            log_history = list(previous.get("log_history", []))
        if (resume / "optimizer.npz").is_file() and start_step:
            with np.load(resume / "optimizer.npz") as saved:
                optimizer = Adam(params, args.lr, {n: saved[n] for n in saved.files})
        print(f"resuming from {resume} at step {start_step}", flush=True)

    print(
        f"spiral-classifier: numpy {np.__version__}, {len(y_train)} train / {n_eval} eval "
        f"samples, 2 hidden layers of {args.hidden}, batch {args.batch_size}, lr {args.lr}, "
        f"steps {start_step + 1}..{args.steps}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} (runs on CPU)",
        flush=True,
    )
    started = time.monotonic()
    train_loss = eval_loss = eval_acc = float("nan")
    for step in range(start_step + 1, args.steps + 1):
        batch = np.random.default_rng([args.seed, step]).integers(0, len(y_train), args.batch_size)
        train_loss, grads = gradients(params, x_train[batch], y_train[batch])
        optimizer.update(params, grads, step)
        last = step == args.steps
        checkpoint_now = args.checkpoint_every and (step % args.checkpoint_every == 0 or last)
        if step % args.log_every == 0 or last or checkpoint_now:
            eval_loss, eval_acc = evaluate(params, x_eval, y_eval)
            log_history.append(
                {
                    "step": step,
                    "epoch": round(step * args.batch_size / len(y_train), 4),
                    "learning_rate": args.lr,
                    "loss": round(train_loss, 6),
                    "eval_loss": round(eval_loss, 6),
                    "eval_accuracy": round(eval_acc, 6),
                }
            )
            print(
                f"step {step}/{args.steps} train_loss={train_loss:.4f} "
                f"eval_loss={eval_loss:.4f} eval_acc={eval_acc:.2f}",
                flush=True,
            )
        if checkpoint_now:
            state = {
                "global_step": step,
                "max_steps": args.steps,
                "epoch": log_history[-1]["epoch"],
                "logging_steps": args.log_every,
                "save_steps": args.checkpoint_every,
                "train_batch_size": args.batch_size,
                "log_history": log_history,
            }
            path = save_checkpoint(checkpoint_dir, step, params, optimizer, config, state)
            print(f"saved checkpoint {path.name}", flush=True)

    runtime = time.monotonic() - started
    if start_step >= args.steps:
        eval_loss, eval_acc = evaluate(params, x_eval, y_eval)
        print(f"nothing to train: the checkpoint is at step {start_step} >= --steps", flush=True)
    write_model(output_dir, params, config)
    metrics = {
        "global_step": max(start_step, args.steps),
        "train_loss": None if np.isnan(train_loss) else round(train_loss, 6),
        "eval_loss": round(eval_loss, 6),
        "eval_accuracy": round(eval_acc, 6),
        "train_runtime_seconds": round(runtime, 3),
        "train_samples_per_second": round(
            (args.steps - min(start_step, args.steps)) * args.batch_size / max(runtime, 1e-9), 1
        ),
        "resumed_from_step": start_step if resume is not None else None,
    }
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(
        f"done in {runtime:.1f}s: eval_loss={eval_loss:.4f} eval_acc={eval_acc:.3f}; "
        f"model written to {output_dir}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
