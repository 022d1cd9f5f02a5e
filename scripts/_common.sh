# Helpers shared by scripts/demo and scripts/test. Source it from the repository root.
# shellcheck shell=bash

if [ -t 1 ]; then
    _BOLD=$'\033[1m' _RED=$'\033[31m' _RESET=$'\033[0m'
else
    _BOLD='' _RED='' _RESET=''
fi

# A banner line before each step.
banner() { printf '\n%s==> %s%s\n' "$_BOLD" "$*" "$_RESET"; }

# A note on stderr.
note() { printf '%s\n' "$*" >&2; }

# Print the message and leave with status 1.
die() {
    printf '%serror:%s %s\n' "$_RED" "$_RESET" "$*" >&2
    exit 1
}

# Run a command as root: directly when we are root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "'$*' needs root and sudo is not installed; run it as root, then run this script again"
    fi
}

apt_install() {
    command -v apt-get >/dev/null 2>&1 \
        || die "$* is missing and this is not a Debian/Ubuntu system (no apt-get): install $* by hand"
    note "installing $* with apt-get ..."
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# ensure_venv SPEC: make sure .venv exists and holds `pip install -e SPEC` (".[server,agent]" or
# ".[dev]", which holds them both). The install is skipped while pyproject.toml is unchanged since
# the last one (a stamp in .venv), so a second run works offline.
ensure_venv() {
    local spec=$1 python=${PYTHON:-python3} stamp=.venv/.flexai-installed key
    if ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
        command -v "$python" >/dev/null 2>&1 \
            || die "$python not found: install Python 3.11 or newer (or set PYTHON=/path/to/python3)"
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || die "Python 3.11 or newer is needed; $python is $("$python" -V 2>&1)"
        note "creating .venv with $("$python" -V 2>&1) ..."
        rm -rf .venv
        if ! "$python" -m venv .venv; then
            # Debian and Ubuntu ship venv's pip apart, in python3-venv.
            if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
                die "could not create .venv (on Debian/Ubuntu: apt-get install python3-venv)"
            fi
            rm -rf .venv
            apt_install python3-venv
            "$python" -m venv .venv || die "could not create .venv with $python"
        fi
    fi
    key="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -f "$stamp" ] && { grep -qxF "$key $spec" "$stamp" \
        || grep -qxF "$key .[dev]" "$stamp"; }; then
        return 0
    fi
    note "installing the project into .venv (pip install -e '$spec') ..."
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec" \
        || die "pip install -e '$spec' failed (see above)"
    { grep -sF "$key " "$stamp" || true; echo "$key $spec"; } >"$stamp.new"
    mv "$stamp.new" "$stamp"
}

# A free TCP port on 127.0.0.1.
free_port() {
    .venv/bin/python -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}
