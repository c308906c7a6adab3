#!/usr/bin/env bash
# Runs the project's checks as named stages and prints what each one cost.
#   tests/run-stages.sh lint | unit | promtool | system | collection | sim | all
# `all` is what `make test` and CI run: lint, unit tests (pure, and the alert rules under
# promtool), system tests (real daemons and
# clients on loopback: sshd, rsync, a Hub-speaking HTTP server with the real huggingface_hub),
# the collection as a user installs it (tests/collection-checks.sh), then the simulated
# two-node cluster with molecule (converge, idempotence, verify) and the
# integration and fault tests on it, then the cluster is removed.
set -uo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONUNBUFFERED=1
export ANSIBLE_FORCE_COLOR=0

what=${1:-all}
# Each stage's budget in seconds on CI's 2 cores, and the whole run's: `make test` must stay under 45
# minutes (CI stops at 90). `all` runs two lanes side by side: the cluster's (sim-bringup, integration,
# integration-ring, sim-down: its budgets add up to 45 minutes less the venv's minute) and the checks',
# whose stages take the time the cluster's leaves idle. The summary prints each stage against its budget so
# that a growing stage is seen in every log; a stage over budget is reported, not failed (a timing is not a
# test result).
TOTAL_BUDGET_S=2700
declare -A budget=(
    [host-packages]=120 [ruff]=30 [yamllint]=30 [ansible-lint]=240 [syntax-check]=150 [changelog-lint]=20
    [integration-untimed]=420 [wait-checks-tests]=60 [pytest-unit]=300 [promtool]=10 [hub-clients]=60 [pytest-system]=240
    [collection-install]=60 [collection-syntax]=150 [collection-docs]=60 [sanity]=420 [ansible-test-units]=300
    [sim-bringup]=400 [integration]=1320 [integration-ring]=480 [sim-down]=20
)
# The integration files that assert no timing and need the reference deployment only: `all` runs them while
# the checks lane's tests may still run beside them (each leaves the reference serving, as the rest expects).
INTEGRATION_UNTIMED="test_api_exposure.py test_bad_inputs.py test_collection_install.py test_discover.py test_image_lock.py test_weights.py"
run_t0=$SECONDS

# Each stage's output is also kept, so that the end of the run can repeat what a failed
# stage printed last (CI shows the end of the output; a failure early in a 40-minute run
# would otherwise be out of sight).
stage_logs=$(mktemp -d)
trap 'rm -rf "$stage_logs"' EXIT
# One line per finished stage (lane, name, seconds, result, its log), appended by whichever lane ran it:
# `all` runs two lanes at once, and a background lane is another process.
records=$stage_logs/records
: >"$records"
lane=main

stage() {
    local name=$1; shift
    local t0=$SECONDS rc log
    log=$(mktemp "$stage_logs/stage-XXXXXX")
    echo
    echo "=== stage: $name"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local result=ok
    [ "$rc" -eq 0 ] || result="FAILED rc=$rc"
    printf '%s\t%s\t%s\t%s\t%s\n' "$lane" "$name" "$((SECONDS - t0))" "$result" "$log" >>"$records"
    echo "=== stage: $name: rc=$rc in $((SECONDS - t0)) s"
    return "$rc"
}

# A lane in the background: its stages' output goes to its log only (printed whole when it is waited
# for, so that two lanes' lines never interleave); its stages are recorded like any other.
declare -A lane_pid=()
lane_bg() {
    local name=$1; shift
    echo
    echo "=== lane: $name (in the background; its output follows when it ends)"
    # In a session of its own (setsid): where the kernel groups CPU time by session (autogroups), the lane's
    # priority is then its own to lower (lowest_cpu_priority), not the whole run's.
    export stage_logs records
    export -f $(compgen -A function)
    setsid -w bash -c 'lane=$0; "$@"' "$name" "$@" >"$stage_logs/lane-$name.out" 2>&1 &
    lane_pid[$name]=$!
}

lane_wait() {
    local name=$1
    wait "${lane_pid[$name]}"
    echo
    echo "=== lane: $name (ran in the background beside the stages above):"
    cat "$stage_logs/lane-$name.out"
}

pytest_stage() {
    # pytest exits 5 when it collects nothing: that is a failure here, not a pass.
    pytest "$@"
    local rc=$?
    [ "$rc" -eq 5 ] && echo "pytest collected no tests in $*: treating as failure"
    return "$rc"
}

syntax_check() {
    # One ansible-playbook per inventory checks every playbook (it takes a list): the interpreter and
    # the collection loader start twice, not once per playbook. An error names its file.
    local rc=0 inv
    for inv in inventory/sim inventory/two-sparks; do
        ansible-playbook --syntax-check -i "$inv" site.yml playbooks/*.yml >/dev/null || { echo "syntax error ($inv): see above"; rc=1; }
    done
    return $rc
}

lint() {
    stage ruff bash -c 'ruff check . && ruff format --check .'
    stage yamllint yamllint -s .
    # ansible-lint installs this collection into ~/.ansible once and does not refresh that
    # copy: a stale one (an older checkout on the same machine) hides new modules from it.
    rm -rf "${HOME}/.ansible/collections/ansible_collections/sparkops"
    stage ansible-lint ansible-lint --profile production --offline
    stage syntax-check syntax_check
    stage changelog-lint antsibull-changelog lint
}

unit() {
    # On every core (pytest-xdist), a test file per worker at a time: a module-scoped fixture that runs a
    # playbook runs once. The unit tests share no state between files.
    stage pytest-unit pytest_stage -q -n "${SPARKOPS_TEST_WORKERS:-auto}" --dist loadfile tests/unit
    stage promtool promtool_rules
}

promtool_rules() {
    # The alert rules under the real promtool (Debian's `prometheus` package; .ci/run installs it).
    if ! command -v promtool >/dev/null; then
        echo "promtool not found: apt-get install --no-install-recommends prometheus (or run .ci/run)"
        return 1
    fi
    promtool --version | head -n 1
    promtool check rules roles/monitoring/files/sparkops-alerts.yml && promtool test rules tests/promtool/*.test.yml
}

system() {
    # The huggingface_hub versions the tests run (tests/system/conftest.py) are installed up front,
    # so a missing PyPI shows as its own failure, not as a test's.
    stage hub-clients python -c 'import sys; sys.path.insert(0, "tests/system"); import conftest as c; [c.install_hub_client(v) for v in c.HUB_CLIENT_VERSIONS]'
    SPARKOPS_REQUIRE_SSHD=1 SPARKOPS_REQUIRE_HUB_CLIENTS=1 stage pytest-system pytest_stage -q tests/system
}

# The built tarball, installed next to only the collections galaxy.yml declares
# (taken from the `ansible` package's bundle: Galaxy is unreachable), checked from
# there. ansible-test keeps its venvs under ~/.ansible/test (cache that in CI).
collection() {
    stage collection-install tests/collection-checks.sh install
    stage collection-syntax tests/collection-checks.sh syntax
    stage collection-docs tests/collection-checks.sh docs
    stage sanity tests/collection-checks.sh sanity
    stage ansible-test-units tests/collection-checks.sh units
}

# The checks that need no host, as `all` runs them beside the simulated cluster's lane, in two parts.
# First, at the normal priority and beside the bring-up and the integration stage's first files (which assert
# no timing), every stage that runs tests: tests time real processes (daemons, deadlines, rates) and must get
# the CPU when they ask for it. The unit tests run once: `ansible-test units` runs the ones the collection
# ships, on the installed copy; pytest runs the rest from the checkout (the files the build leaves out and the
# files of the tests ansible-test skipped there). The cluster's lane waits for this part before its
# timing-sensitive stage (checks_tests_done). Then the static checks, which time nothing, at the lowest CPU
# priority the kernel offers (lowest_cpu_priority): they take only the time the cluster's lane leaves idle. The
# whole lane uses Ansible's local temporary folder of its own, so that its runs' module caches never prune the
# cluster's.
checks_lane() {
    export ANSIBLE_LOCAL_TEMP="$stage_logs/ansible-local-checks"
    system
    stage collection-install tests/collection-checks.sh install
    rm -rf "$(installed_collection)/tests/output/junit"
    stage ansible-test-units tests/collection-checks.sh units
    # shellcheck disable=SC2046 # one path per word
    stage pytest-unit pytest_stage -q -n "${SPARKOPS_TEST_WORKERS:-auto}" --dist loadfile $(unit_tests_not_run_installed)
    touch "$stage_logs/checks-tests-done"
    lowest_cpu_priority
    lint
    stage promtool promtool_rules
    stage collection-syntax tests/collection-checks.sh syntax
    stage collection-docs tests/collection-checks.sh docs
    stage sanity tests/collection-checks.sh sanity
}

installed_collection() {
    tests/collection-checks.sh env | sed -n 's/^SPARKOPS_INSTALLED_COLLECTION=//p'
}

# The unit test files `ansible-test units` did not run on the installed collection: those the build leaves out,
# and those with a test it skipped there (a checkout-only test). Without its results, all of tests/unit.
unit_tests_not_run_installed() {
    python3 tests/unit_tests_not_run_installed.py "$(installed_collection)"
}

# In the cluster's lane, before the stages that time the cluster: wait until the checks lane's tests are done
# (bounded by that lane: it ends, or it says so).
checks_tests_done() {
    [ -n "${lane_pid[checks]:-}" ] || return 0
    while [ ! -e "$stage_logs/checks-tests-done" ] && kill -0 "${lane_pid[checks]}" 2>/dev/null; do
        sleep 2
    done
    return 0
}

# This shell and what it starts take only CPU time nobody else wants. `nice` alone is not enough: it orders
# the tasks of one scheduling group, and the nodes' processes run in their containers' cgroups (the kernel
# weighs a group against a group, whatever its tasks' nice). So the lane goes into a cgroup of its own with the
# idle policy (cgroup v1 or v2 `cpu.idle`, else the smallest weight), or where none can be made (no cgroup
# access), into an autogroup of its own at nice 19. It says which.
export CHECKS_CGROUP=sparkops-checks-$$
lowest_cpu_priority() {
    renice -n 19 -p "$BASHPID" >/dev/null
    ionice -c 2 -n 7 -p "$BASHPID" >/dev/null 2>&1 || true
    local dir how=""
    for dir in /sys/fs/cgroup/cpu/$CHECKS_CGROUP /sys/fs/cgroup/$CHECKS_CGROUP; do
        mkdir "$dir" 2>/dev/null || continue
        if { [ -e "$dir/cpu.idle" ] && echo 1 >"$dir/cpu.idle"; } 2>/dev/null; then
            how="cgroup $dir, cpu.idle 1"
        elif { [ -e "$dir/cpu.shares" ] && echo 2 >"$dir/cpu.shares"; } 2>/dev/null; then
            how="cgroup $dir, cpu.shares 2"
        elif { [ -e "$dir/cpu.weight" ] && echo 1 >"$dir/cpu.weight"; } 2>/dev/null; then
            how="cgroup $dir, cpu.weight 1"
        fi
        if [ -n "$how" ] && echo "$BASHPID" 2>/dev/null >"$dir/cgroup.procs"; then
            break
        fi
        how=""
        rmdir "$dir" 2>/dev/null
    done
    if [ -z "$how" ] && [ -w /proc/self/autogroup ]; then
        # A session of its own is an autogroup of its own (when the kernel groups by session).
        how="autogroup at nice 19"
        echo 19 >"/proc/$BASHPID/autogroup" 2>/dev/null || how=""
    fi
    echo "checks lane: lowest CPU priority: nice 19${how:+, $how}"
}

remove_checks_cgroup() {
    local dir
    for dir in /sys/fs/cgroup/cpu/$CHECKS_CGROUP /sys/fs/cgroup/$CHECKS_CGROUP; do
        [ -d "$dir" ] && rmdir "$dir" 2>/dev/null
    done
    return 0
}

# The simulated pair from nothing, deployed by molecule (converge, idempotence, verify): the first stage of
# the cluster's lane, which the integration stages follow.
sim_bringup() {
    # The tests assume a cluster with no history: no watchdog restarts, no upgraded image in the lock,
    # nothing torn down. Whatever a user did with the simulated cluster before `make test`, these
    # stages start from one they make (the cached images stay, so it is a warm start).
    fresh_sim && make -s sim-up && molecule test -s default
}

sim_tests() {
    # -s: the tests print the measured figures (no-op time, upgrade downtime, rollback time).
    # First the files that time nothing (the checks lane's tests may still run beside them), then the rest.
    local early=() f
    for f in $INTEGRATION_UNTIMED; do early+=("tests/integration/$f"); done
    SPARKOPS_REQUIRE_SIM=1 SPARKOPS_SIM_TOPOLOGIES=0 \
        stage integration-untimed pytest_stage -q -s --durations=10 "${early[@]}"
    stage wait-checks-tests checks_tests_done
    SPARKOPS_REQUIRE_SIM=1 SPARKOPS_SIM_TOPOLOGIES=0 \
        stage integration pytest_stage -q -s --durations=30 "${early[@]/#/--ignore=}" tests/integration
    # Last, since it replaces the pair with a 4-node switch, then ring (and puts the pair back).
    # SPARKOPS_SIM_TOPOLOGIES=0 make test skips it.
    local pair_after=1
    [ "${SPARKOPS_KEEP_SIM:-0}" = 1 ] || pair_after=0  # sim-down follows: no pair to put back first
    SPARKOPS_REQUIRE_SIM=1 SPARKOPS_SIM_TOPOLOGIES="${SPARKOPS_SIM_TOPOLOGIES:-1}" \
        SPARKOPS_SIM_PAIR_AFTER_TOPOLOGIES=$pair_after \
        stage integration-ring pytest_stage -q -s --durations=10 tests/integration/test_topologies.py
    [ "${SPARKOPS_KEEP_SIM:-0}" = 1 ] || stage sim-down make -s sim-down
}

sim() {
    stage sim-bringup sim_bringup
    sim_tests
}

fresh_sim() {
    if docker ps -a --filter label=io.sparkops.sim=node --format '{{.Names}}' 2>/dev/null | grep -q .; then
        echo "make test replaces the running simulated cluster with a new one (its lock, key and reports too):"
        echo "the tests start from a cluster with no history. The cached images stay."
    fi
    python3 sim/simctl.py down --reset-state
}

case "$what" in
    lint) lint ;;
    unit) unit ;;
    promtool) stage promtool promtool_rules ;;
    system) system ;;
    collection) collection ;;
    sim) sim ;;
    all)
        # What this machine needs first (on a fresh one: Docker, debootstrap, OpenSSH's server, ...): before the
        # lanes split, so that the checks lane's system tests never start an sshd whose package is still being
        # installed by the cluster's bring-up ("Privilege separation user sshd does not exist").
        stage host-packages python3 sim/simctl.py ensure-host || { echo "the test bed's packages could not be installed"; exit 1; }
        # Two lanes side by side. The simulated cluster's (bring-up, integration, the ring) is the long one and
        # runs in front; the checks that need no host run beside it in the background (checks_lane).
        lane_bg checks checks_lane
        lane=cluster
        if stage sim-bringup sim_bringup; then sim_tests; else echo "the simulated pair did not come up: integration skipped"; fi
        lane_wait checks
        remove_checks_cgroup
        ;;
    *) echo "usage: $0 lint|unit|promtool|system|collection|sim|all" >&2; exit 2 ;;
esac

echo
echo "Stage timings (seconds; budget; in the order they ended; \`all\` runs the lane \"checks\" beside the lane \"cluster\"):"
failed=0 count=0
while IFS=$'\t' read -r l name secs result _log; do
    b=${budget[$name]:-0}
    over=""
    [ "$b" -gt 0 ] && [ "$secs" -gt "$b" ] && over="  OVER BUDGET by $((secs - b)) s"
    printf '  %-8s %-20s %5d s  / %5d s  %s%s\n' "$l" "$name" "$secs" "$b" "$result" "$over"
    count=$((count + 1))
    [ "$result" = ok ] || failed=$((failed + 1))
done <"$records"
total=$((SECONDS - run_t0))
printf '  %-29s %5d s  / %5d s  (%d min of 45)%s\n' "total (wall)" "$total" "$TOTAL_BUDGET_S" $((total / 60)) \
    "$([ "$what" = all ] && [ "$total" -gt "$TOTAL_BUDGET_S" ] && echo "  OVER BUDGET")"
echo "stages: $((count - failed)) passed, $failed failed"
while IFS=$'\t' read -r l name _secs result log; do
    [ "$result" = ok ] && continue
    echo
    echo "=== what the failed stage $name (lane $l) printed last:"
    tail -n 60 "$log"
done <"$records"
[ "$failed" -eq 0 ]
