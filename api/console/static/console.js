// The console's only script (the Content-Security-Policy allows no other): it keeps open pages
// current from their server-sent events. Everything a job wrote is inserted as text nodes or
// textContent, never as markup.
"use strict";

const LOG_KEEP = 2 * 1024 * 1024; // characters of log a page keeps; the download has them all
const WAITING = new Set(["scheduling", "enqueued"]);

function field(root, name) {
  return root.querySelector(`[data-field="${name}"]`);
}

function setStatus(element, status) {
  if (!element) return;
  element.textContent = status;
  element.className = "status s-" + status.replace(/ /g, "-");
}

function say(text) {
  const live = field(document, "live") || field(document, "log-state");
  if (live) live.textContent = text;
}

// -- the jobs page ------------------------------------------------------------------------------

function followJobs(table) {
  const source = new EventSource(table.dataset.live);
  source.addEventListener("jobs", (message) => {
    for (const job of JSON.parse(message.data)) {
      const row = table.querySelector(`tr[data-job-id="${CSS.escape(job.id)}"]`);
      if (!row) continue;
      setStatus(field(row, "status"), job.deleted ? "deleted" : job.status);
      field(row, "duration").textContent = job.duration;
      field(row, "reason").textContent = job.reason || "";
    }
    say("");
  });
  source.addEventListener("error", () => say("Live updates paused: reconnecting…"));
}

// -- a job page ---------------------------------------------------------------------------------

function appendLog(pre, text) {
  const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
  const last = pre.lastChild;
  if (last && last.nodeType === Node.TEXT_NODE && last.length < 65536) {
    last.appendData(text);
  } else {
    pre.appendChild(document.createTextNode(text));
  }
  let extra = pre.textContent.length - LOG_KEEP;
  while (extra > 0 && pre.firstChild) {
    const first = pre.firstChild;
    if (first.length <= extra) {
      extra -= first.length;
      pre.removeChild(first);
    } else {
      first.deleteData(0, extra);
      extra = 0;
    }
  }
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function historyItem(entry) {
  const item = document.createElement("li");
  item.dataset.version = String(entry.version);
  const when = item.appendChild(document.createElement("span"));
  when.className = "when";
  const version = when.appendChild(document.createElement("span"));
  version.className = "version";
  version.textContent = "v" + entry.version;
  when.appendChild(document.createTextNode(" "));
  const time = when.appendChild(document.createElement("time"));
  time.dateTime = entry.at_iso || "";
  time.textContent = entry.at;
  const what = item.appendChild(document.createElement("span"));
  what.className = "what";
  what.appendChild(document.createElement("strong")).textContent = entry.event;
  what.appendChild(document.createTextNode(" → "));
  setStatus(what.appendChild(document.createElement("span")), entry.status);
  const by = what.appendChild(document.createElement("span"));
  by.className = "by";
  by.textContent = " by " + entry.by;
  if (entry.facts.length) {
    const facts = item.appendChild(document.createElement("dl"));
    facts.className = "facts-list";
    for (const [key, value] of entry.facts) {
      facts.appendChild(document.createElement("dt")).textContent = key;
      facts.appendChild(document.createElement("dd")).textContent = value;
    }
  }
  return item;
}

function showJob(job) {
  setStatus(field(document, "status"), job.status);
  field(document, "duration").textContent = job.duration;
  const failure = field(document, "failure");
  failure.textContent = job.failure;
  failure.hidden = job.failure === "-";
  for (const [action, allowed] of [["stop", job.can_stop], ["delete", job.can_delete]]) {
    const form = document.querySelector(`details[data-action="${action}"]`);
    if (form) form.hidden = !allowed;
  }
  const waiting = field(document, "waiting");
  if (waiting) waiting.hidden = !WAITING.has(job.status);
  const timeline = field(document, "history");
  const shown = new Set([...timeline.children].map((item) => item.dataset.version));
  for (const entry of job.history) {
    if (!shown.has(String(entry.version))) timeline.appendChild(historyItem(entry));
  }
  const slider = document.getElementById("version");
  if (slider && job.history.length) {
    const newest = Math.max(...job.history.map((entry) => entry.version));
    slider.max = String(Math.max(Number(slider.max), newest));
  }
}

function followJob(pre) {
  const state = field(document, "log-state");
  const source = new EventSource(pre.dataset.live);
  source.addEventListener("open", () => { state.textContent = "Following the log live."; });
  source.addEventListener("log", (message) => appendLog(pre, JSON.parse(message.data)));
  source.addEventListener("job", (message) => showJob(JSON.parse(message.data)));
  source.addEventListener("end", (message) => {
    source.close();
    const end = JSON.parse(message.data);
    if (end.current > end.attempt && "pinned" in pre.dataset) {
      state.textContent = `Attempt ${end.attempt} ended: this is its last line.`;
    } else if (end.current > end.attempt) { // the job runs again: show its current attempt
      state.textContent = `Attempt ${end.attempt} ended: on to attempt ${end.current}…`;
      window.location.reload();
    } else {
      state.textContent = "The job ended: this is its last line.";
    }
  });
  source.addEventListener("error", () => {
    if (source.readyState !== EventSource.CLOSED) state.textContent = "Reconnecting to the log…";
  });
}

// A confirmed action sent without leaving the page: the live stream shows what follows.
function sendInPlace(form) {
  form.addEventListener("submit", async (submitted) => {
    submitted.preventDefault();
    const message = field(document, "message");
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const answer = await fetch(form.action, {
        method: "POST",
        body: new URLSearchParams(new FormData(form)),
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      const body = await answer.json();
      message.textContent = answer.ok ? "Stop requested." : `${body.title}: ${body.detail}`;
      if (answer.ok) form.closest("details").open = false;
    } catch (error) {
      message.textContent = "The server could not be reached: try again.";
    } finally {
      button.disabled = false;
    }
  });
}

function showSliderValue(slider) {
  const output = document.getElementById(slider.dataset.output);
  slider.addEventListener("input", () => { output.textContent = slider.value; });
}

document.addEventListener("DOMContentLoaded", () => {
  const jobs = document.querySelector("table.jobs[data-live]");
  if (jobs && window.EventSource) followJobs(jobs);
  const log = document.querySelector("pre.log[data-live]");
  if (log && window.EventSource) followJob(log);
  for (const form of document.querySelectorAll("form[data-fetch]")) sendInPlace(form);
  for (const slider of document.querySelectorAll("input[type=range][data-output]")) {
    showSliderValue(slider);
  }
});
