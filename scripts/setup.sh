#!/bin/sh
# Installs what withruntime needs from Debian packages: the build toolchain and
# libraries, runsc from bookworm-backports, mmdebstrap for images, and
# e2fsprogs (mke2fs) for each sandbox's disk image. With --tests, also what only
# the tests use (scripts/test.sh passes it; scripts/install.sh does not, so a
# plain install gets no browsers).
# Idempotent: packages already present are left alone. Needs root.
set -eu

tests=0
case "${1:-}" in
    --tests) tests=1 ;;
    "") ;;
    *) echo "usage: setup.sh [--tests]" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive

# Add bookworm-backports beside the host's own Debian source, taking the
# mirror from the host's apt configuration.
add_backports() {
    if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        return 0
    fi
    mirror=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
        mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list)
    fi
    if [ -z "$mirror" ]; then
        echo "setup.sh: cannot find the host's Debian mirror in its apt sources" >&2
        exit 1
    fi
    cat >/etc/apt/sources.list.d/withruntime-backports.sources <<SRC
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    echo "setup.sh: added bookworm-backports from $mirror"
}

PKGS="build-essential pkg-config libevent-dev libjansson-dev libsqlite3-dev libssl-dev \
nftables libnftables-dev \
mmdebstrap iproute2 procps ca-certificates \
python3 python3-venv e2fsprogs"
# For the tests: clang-format (make format-check); zsh (the tests load `withruntime completion
# zsh` in it); chromium, chromium-driver (tests/e2e/test_dashboard.py drives the dashboard in a
# real browser); firefox-esr (tests/e2e/test_dashboard_firefox.py does in Firefox, over the
# WebDriver BiDi that Firefox speaks itself: Debian has no geckodriver).
if [ "$tests" -eq 1 ]; then
    PKGS="$PKGS clang-format zsh chromium chromium-driver firefox-esr"
fi

need=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done

runsc_ok=0
if command -v runsc >/dev/null 2>&1; then
    # 0.0~2024... or later from backports; Debian 12's own (2022) breaks ls.
    v=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || echo 0)
    case "$v" in
        0.0~2022*) runsc_ok=0 ;;
        *) runsc_ok=1 ;;
    esac
fi

if [ -n "$need" ] || [ "$runsc_ok" -eq 0 ]; then
    add_backports
    apt-get update -qq
    if [ -n "$need" ]; then
        apt-get install -y -qq $need
    fi
    if [ "$runsc_ok" -eq 0 ]; then
        apt-get install -y -qq -t bookworm-backports runsc
    fi
fi
