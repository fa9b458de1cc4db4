#!/bin/sh
# Sets up withruntime on this machine: Debian packages (scripts/setup.sh),
# the build, `make install` (withruntime onto the PATH in /usr/local/bin),
# and the default image (built once, then cached). Needs root.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
make -j"$(nproc)"
make install PREFIX="${PREFIX:-/usr/local}"
"${PREFIX:-/usr/local}/bin/withruntime" image build
