#!/bin/bash
# Stand-in for eugr/spark-vllm-docker's build-and-copy.sh, used only by the
# sparkops simulated cluster. It accepts EXACTLY the argument grammar of the
# real script at the pinned commit, eugr/spark-vllm-docker@fc08740 (2026-04-10),
# build-and-copy.sh:297-364 (read, not copied):
#   -t|--tag V, --gpu-arch V, --rebuild-flashinfer, --rebuild-vllm,
#   --vllm-ref V, --flashinfer-ref V,
#   -c|--copy-to|--copy-to-host|--copy-to-hosts H... (every word up to the next -flag),
#   -j|--build-jobs V, -u|--user V, --copy-parallel,
#   --tf5|--pre-tf|--pre-transformers, --exp-mxfp4|--experimental-mxfp4,
#   --apply-vllm-pr N, --apply-flashinfer-pr N (a value that starts with - is an error),
#   --full-log, --no-build, --cleanup, --network V (same rule), --config V, --setup,
#   -h|--help (usage, exit 1); anything else: "Unknown parameter passed: X", usage, exit 1.
# So `--use-wheels` (removed in ec0f189, 2026-02-17) is refused, as the real one refuses it.
#
# What it builds mirrors what the real one would carry, from upstream-versions.env:
# --vllm-ref vX.Y.Z gives a build of that tag's commit with the version eugr's build
# reports for it (a dirty tree at the tag: X.Y.(Z+1).dev0+g<commit>.d<day>.cu132, see
# vllm_version_of); without it (or with main) vLLM's main of the build day, a dev
# version, as the real script builds origin/main (Dockerfile:174-191).
# Likewise FlashInfer (--flashinfer-ref). torch is PyTorch's nightly of the build day
# (Dockerfile:53, :314), NCCL the branch build (Dockerfile:76), CUDA the base image's
# (Dockerfile:9). Ray is the real Ray from the test bed's wheels. `vllm` is a TEST DOUBLE.
set -euo pipefail

usage() {
    echo "Usage: $0 [OPTIONS]   (sparkops stand-in; grammar of eugr/spark-vllm-docker@fc08740)"
    echo "  -t, --tag <tag>  --gpu-arch <arch>  --rebuild-flashinfer  --rebuild-vllm"
    echo "  --vllm-ref <ref>  --flashinfer-ref <ref>  -c, --copy-to <hosts>  --copy-parallel"
    echo "  -j, --build-jobs <jobs>  -u, --user <user>  --tf5  --exp-mxfp4"
    echo "  --apply-vllm-pr <pr>  --apply-flashinfer-pr <pr>  --full-log  --no-build  --cleanup"
    echo "  --network <network>  --config <file>  --setup  -h, --help"
    exit 1
}

need_value() {  # FLAG NEXT: the real script's rule for --apply-*-pr and --network
    if [ -z "${2:-}" ] || [ "${2#-}" != "$2" ]; then
        echo "Error: $1 requires a value." >&2
        exit 1
    fi
}

TAG="vllm-node"
VLLM_REF="main"
FLASHINFER_REF="main"
NO_BUILD=false
COPY_HOSTS=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        -t|--tag) TAG="${2:?$1 needs a value}"; shift ;;
        --vllm-ref) VLLM_REF="${2:?$1 needs a value}"; shift ;;
        --flashinfer-ref) FLASHINFER_REF="${2:?$1 needs a value}"; shift ;;
        --gpu-arch|-j|--build-jobs|-u|--user|--config) : "${2:?$1 needs a value}"; shift ;;
        --rebuild-flashinfer|--rebuild-vllm|--copy-parallel|--tf5|--pre-tf|--pre-transformers) ;;
        --exp-mxfp4|--experimental-mxfp4|--full-log|--cleanup|--setup) ;;
        --no-build) NO_BUILD=true ;;
        --apply-vllm-pr|--apply-flashinfer-pr|--network) need_value "$1" "${2:-}"; shift ;;
        -c|--copy-to|--copy-to-host|--copy-to-hosts)
            shift
            while [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; do COPY_HOSTS+=("$1"); shift; done
            continue ;;
        -h|--help) usage ;;
        *) echo "Unknown parameter passed: $1"; usage ;;
    esac
    shift
done

cd "$(dirname "$0")"
# shellcheck source=/dev/null
. ./upstream-versions.env

# A release tag vX.Y.Z (or vX.Y.ZrcN) is that version; main is the build day's dev version.
# Anything else the stand-in cannot know: refused, as a checkout of an unknown ref fails.
version_of() {  # NAME REF MAIN_VERSION
    case "$2" in
        main) echo "$3" ;;
        *)
            if [[ "$2" =~ ^v([0-9]+\.[0-9]+\.[0-9]+(rc[0-9]+)?)$ ]]; then
                echo "${BASH_REMATCH[1]}"
            else
                echo "stand-in: $1 ref '$2' is neither main nor a release tag vX.Y.Z" >&2
                exit 1
            fi ;;
    esac
}

# vLLM's version as eugr's build gets it. Dockerfile@fc08740:231-236 runs use_existing_torch.py and
# deletes lines of requirements/*.txt in the checkout before `uv build` (:253), so setuptools-scm
# (vcs_versioning/_version_schemes/_standard.py) sees a DIRTY tree: guess_next_dev_version is not
# `exact`, so a tag X.Y.Z becomes the next version's dev0 (X.Y.(Z+1).dev0; an rcN tag rc(N+1).dev0),
# and get_local_node_and_date labels it +g<commit>.d<YYYYMMDD> (UTC, or SOURCE_DATE_EPOCH); on main
# the clean describe's +g<commit> gets .d<date> added. vLLM's setup.py get_vllm_version() then
# appends the CUDA as `cu<major><minor>` (separator "." when a "+" is already there) because nvcc's
# 13.2 is not VLLM_MAIN_CUDA_VERSION (12.9 in 0.19.0, vllm/envs.py:76).
VLLM_COMMIT=""
vllm_version_of() {  # REF
    local base day cuda commit pair
    base=$(version_of vLLM "$1" "$VLLM_MAIN_VERSION") || exit 1
    day=$(date -u ${SOURCE_DATE_EPOCH:+-d "@$SOURCE_DATE_EPOCH"} +%Y%m%d)
    cuda=$(echo "$CUDA_BASE_VERSION" | awk -F. '{print $1 $2}')
    if [ "$1" = main ]; then
        commit=${base##*+g}
        echo "$commit ${base}.d${day}.cu${cuda}"
        return
    fi
    commit=""
    for pair in $VLLM_TAG_COMMITS; do
        [ "${pair%%=*}" = "$1" ] && commit=${pair#*=}
    done
    if [ -z "$commit" ]; then
        echo "stand-in: no commit recorded for vLLM tag $1 (VLLM_TAG_COMMITS in upstream-versions.env)" >&2
        exit 1
    fi
    if [[ "$base" =~ ^([0-9]+\.[0-9]+\.)([0-9]+)$ ]]; then
        base="${BASH_REMATCH[1]}$((BASH_REMATCH[2] + 1))"
    elif [[ "$base" =~ ^(.*rc)([0-9]+)$ ]]; then
        base="${BASH_REMATCH[1]}$((BASH_REMATCH[2] + 1))"
    fi
    echo "$commit ${base}.dev0+g${commit}.d${day}.cu${cuda}"
}
read -r VLLM_COMMIT VLLM_VERSION < <(vllm_version_of "$VLLM_REF") || exit 1
[ -n "$VLLM_VERSION" ] || exit 1
FLASHINFER_VERSION=$(version_of FlashInfer "$FLASHINFER_REF" "$FLASHINFER_MAIN_VERSION")

echo "stand-in: vLLM $VLLM_VERSION (--vllm-ref $VLLM_REF), FlashInfer $FLASHINFER_VERSION (--flashinfer-ref $FLASHINFER_REF)" >&2
if [ "${#COPY_HOSTS[@]}" -gt 0 ]; then
    echo "stand-in build-and-copy.sh: copying is sparkops' job here; not copying to ${COPY_HOSTS[*]}" >&2
fi
if [ "$NO_BUILD" = true ]; then
    echo "Skipping build (--no-build specified)"
    exit 0
fi

WHEELS=${SPARKOPS_SIM_WHEELS:-/srv/sparkops-sim/wheels}
if [ ! -d "$WHEELS" ]; then
    echo "stand-in build: no Ray wheels at $WHEELS (the test bed mounts them)" >&2
    exit 1
fi
RAY_VERSION=$(find "$WHEELS" -maxdepth 1 -name 'ray-*.whl' -printf '%f\n' | head -1 | cut -d- -f2)
rm -rf wheels
cp -r "$WHEELS" wheels
trap 'rm -rf wheels' EXIT
start=$(date +%s)
docker build --network none -t "$TAG" \
    --build-arg "VLLM_VERSION=$VLLM_VERSION" \
    --build-arg "VLLM_COMMIT=$VLLM_COMMIT" \
    --build-arg "FLASHINFER_VERSION=$FLASHINFER_VERSION" \
    --build-arg "TORCH_VERSION=$TORCH_NIGHTLY_VERSION" \
    --build-arg "NCCL_VERSION=$NCCL_BRANCH_VERSION" \
    --build-arg "CUDA_VERSION=$CUDA_BASE_VERSION" \
    --build-arg "RAY_VERSION=$RAY_VERSION" \
    .
echo "Build completed in $(( $(date +%s) - start )) s: $TAG (vLLM $VLLM_VERSION, FlashInfer $FLASHINFER_VERSION)"
