#!/usr/bin/env bash
# Installs the peers from the package registries: Debian's oneDNN (libdnnl-dev, 2.6) and a
# Python venv (bench/peers/.venv) with numpy (OpenBLAS), threadpoolctl and TVM 0.27 with what
# MetaSchedule needs. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ ! -f /usr/include/oneapi/dnnl/dnnl.hpp ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libdnnl-dev g++ >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libdnnl-dev g++ >/dev/null; }
fi
if [ ! -x "$here/.venv/bin/python" ]; then
  python3 -m venv "$here/.venv" \
    || { apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$here/.venv"; }
fi
# apache-tvm-ffi newer than 0.1.14.post0 segfaults on MetaSchedule's first database write.
"$here/.venv/bin/pip" install -q --disable-pip-version-check \
  numpy threadpoolctl "apache-tvm==0.27.0.post1" "apache-tvm-ffi==0.1.14.post0" \
  xgboost-cpu cloudpickle psutil tornado
g++ -O2 -std=c++17 "$here/onednn_bench.cpp" -o "$here/.venv/onednn_bench" -ldnnl
echo "peers installed in $here/.venv"
