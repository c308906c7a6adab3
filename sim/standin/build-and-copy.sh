#!/bin/bash
# Stand-in for eugr/spark-vllm-docker's build-and-copy.sh, used only by the
# sparkops simulated cluster. It keeps the part of that script's interface the
# spark_vllm_image role calls (`-t/--tag`; other flags are accepted and logged)
# and builds a small image: Debian bookworm, Ray from local wheels, and a vLLM
# TEST DOUBLE as the `vllm` command. The real script builds vLLM for SM121.
set -euo pipefail

TAG="vllm-node"
while [ "$#" -gt 0 ]; do
    case "$1" in
        -t|--tag) TAG="$2"; shift ;;
        --use-wheels)
            if [ "$#" -gt 1 ] && [ "${2#-}" = "$2" ]; then shift; fi ;;
        --vllm-ref|--triton-ref|-j|--build-jobs|-u|--user) shift ;;
        --rebuild-deps|--rebuild-vllm|--pre-flashinfer|--pre-tf|--pre-transformers) ;;
        -c|--copy-to|--copy-to-host|--copy-to-hosts|--copy-parallel|--no-build)
            echo "stand-in build-and-copy.sh: copying is sparkops' job here; $1 ignored" >&2 ;;
        *) echo "Unknown parameter passed: $1" >&2; exit 1 ;;
    esac
    shift
done

cd "$(dirname "$0")"
WHEELS=${SPARKOPS_SIM_WHEELS:-/srv/sparkops-sim/wheels}
if [ ! -d "$WHEELS" ]; then
    echo "stand-in build: no Ray wheels at $WHEELS (the test bed mounts them)" >&2
    exit 1
fi
rm -rf wheels
cp -r "$WHEELS" wheels
trap 'rm -rf wheels' EXIT
start=$(date +%s)
docker build --network none -t "$TAG" .
echo "Build completed in $(( $(date +%s) - start )) s: $TAG"
