#!/usr/bin/env bash
# ferry's two set-up commands, for a fresh Debian 12 machine:
#
#   ./setup.sh run    install what is missing, build, write the sample dataset and run
#                     configs/demo.yaml with the ferry command
#   ./setup.sh test   install what is missing, build, and run every test
#
# Debian packages are installed only when missing (as root, or through sudo). The build goes to
# ./build (override with FERRY_BUILD_DIR).
set -euo pipefail

cd "$(dirname "$0")"
mode="${1:-}"
case "$mode" in
  run | test) ;;
  *)
    echo "usage: $0 run|test" >&2
    exit 2
    ;;
esac

build_dir="${FERRY_BUILD_DIR:-build}"
jobs="$(nproc)"
packages=(cmake g++ ninja-build libtorch-dev nlohmann-json3-dev libopencv-dev libjpeg-dev
          libpng-dev libtbb-dev libyaml-cpp-dev libcli11-dev libcurl4-openssl-dev)
# The tests: GoogleTest; the vision tests compare against torchvision, run by Debian's Python;
# the token tests' reference files are written with numpy; the launcher test runs torchrun and
# mpirun; the remote-shard tests serve shards with nginx (and an S3 server that npm installs into
# the build folder where Node is present).
if [ "$mode" = test ]; then
  packages+=(libgtest-dev libgmock-dev python3-torchvision python3-pil python3-numpy openmpi-bin
             nginx-light)
fi

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> installing Debian packages: ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  # No package starts a service (nginx would take port 80): the tests start their own servers.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" || { [ "$own_policy" = 1 ] && "${sudo[@]}" rm -f "$policy"; exit 1; }
  if [ "$own_policy" = 1 ]; then "${sudo[@]}" rm -f "$policy"; fi
fi

# The run needs the library, the ferry command and ferry-worker; the tests need everything.
if [ "$mode" = run ]; then
  parts=OFF
  targets=(--target ferry_cli ferry-worker)
else
  parts=ON
  targets=()
fi
echo "==> configuring ($build_dir)"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_BUILD_TESTS=$parts \
  -DFERRY_BUILD_BENCH=$parts -DFERRY_BUILD_EXAMPLES=$parts
echo "==> building ${targets[*]:-everything} with $jobs jobs"
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"

if [ "$mode" = run ]; then
  FERRY_SAMPLE_DATA="$(cd "$build_dir" && pwd)/sample-data"
  export FERRY_SAMPLE_DATA  # configs/demo.yaml reads it
  echo "==> writing the sample dataset ($FERRY_SAMPLE_DATA)"
  "$build_dir/bin/ferry" sample-data "$FERRY_SAMPLE_DATA"
  echo "==> running configs/demo.yaml"
  exec "$build_dir/bin/ferry" run configs/demo.yaml --epochs 3
else
  echo "==> running the tests"
  exec ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
fi
