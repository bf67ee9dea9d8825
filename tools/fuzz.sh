#!/usr/bin/env bash
# `make fuzz`: the differential random-program tester at scale, split into FUZZ_JOBS shards run
# FUZZ_PARALLEL at a time (one per core by default; each program is one IREE compile on one core).
# Shard k runs FUZZ_EXAMPLES/FUZZ_JOBS programs from seed SEED+k, so the whole run is reproducible
# from SEED. With FUZZ_LOGS=DIR, each shard's log lives in DIR and a shard whose log says it passed
# is not run again: a run of thousands of programs can be stopped and resumed. FUZZ_SHARDS="12 16-39"
# runs those shards alone (a run resumed on another machine, from the shards' numbers).
set -u
examples=${FUZZ_EXAMPLES:-1000}
parallel=${FUZZ_PARALLEL:-$(nproc)}
jobs=${FUZZ_JOBS:-$parallel}
seed=${GRADLOOP_FUZZ_SEED:-$(python3 -c 'import random; print(random.randrange(2**31))')}
per_job=$(( (examples + jobs - 1) / jobs ))
logs=${FUZZ_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
echo "GRADLOOP_FUZZ_SEED=$seed: $jobs shards of $per_job programs, $parallel at a time (logs in $logs)"
start=$(date +%s)

passed() { grep -q "^[0-9]* passed" "$logs/job$1.log" 2>/dev/null; }

run_shard() {
	# A shard shares the machine (other shards, other work; niced, it may wait out whole
	# builds): 120 s a program before it times out, and 20 minutes an IREE compile. A heavy draw
	# (second order through nested switches of factorisations) is minutes of compiling alone;
	# at a shared core's speed the default 300 s would fail it for the machine's load, which is
	# not what the fuzzer looks for.
	GRADLOOP_FUZZ_SEED=$((seed + $1)) GRADLOOP_FUZZ_EXAMPLES=$per_job GRADLOOP_FUZZ_HEAVY=1 \
		GRADLOOP_VMAP_FUZZ_EXAMPLES=$per_job GRADLOOP_VMAP_FUZZ_COMPILED_EXAMPLES=$((per_job / 10 + 1)) \
		GRADLOOP_FUZZ_BUDGET_S=$((600 + 120 * per_job)) \
		GRADLOOP_COMPILE_TIMEOUT_S=${GRADLOOP_COMPILE_TIMEOUT_S:-1200} \
		python -m pytest -q -x -p no:cacheprovider --hypothesis-show-statistics \
		tests/test_fuzz_modes.py::test_modes_agree_on_random_programs \
		tests/test_fuzz_modes.py::test_graph_mode_agrees_on_many_random_programs \
		tests/test_vmap_fuzz.py \
		>"$logs/job$1.log.part" 2>&1
	local rc=$?
	mv "$logs/job$1.log.part" "$logs/job$1.log"
	return $rc
}

failed=0
declare -A running=()
report() {
	local k=$1 rc=$2
	if [ "$rc" -eq 0 ]; then
		echo "shard $k (GRADLOOP_FUZZ_SEED=$((seed + k))): $(tail -n 1 "$logs/job$k.log")"
	else
		failed=1
		echo "shard $k FAILED (reproduce with GRADLOOP_FUZZ_SEED=$((seed + k)) GRADLOOP_FUZZ_EXAMPLES=$per_job):"
		grep -v "FormWarning\|results = stage" "$logs/job$k.log" | tail -n 40
	fi
}
reap() {
	local k
	for k in "${!running[@]}"; do
		if ! kill -0 "${running[$k]}" 2>/dev/null; then
			wait "${running[$k]}"
			report "$k" $?
			unset "running[$k]"
		fi
	done
}
shards() {
	if [ -z "${FUZZ_SHARDS:-}" ]; then
		seq 0 $((jobs - 1))
		return
	fi
	local range
	for range in $FUZZ_SHARDS; do
		seq "${range%-*}" "${range#*-}"
	done
}
for k in $(shards); do
	if passed "$k"; then
		echo "shard $k (GRADLOOP_FUZZ_SEED=$((seed + k))): passed before: $(tail -n 1 "$logs/job$k.log")"
		continue
	fi
	while [ "${#running[@]}" -ge "$parallel" ]; do
		sleep 2
		reap
	done
	run_shard "$k" &
	running[$k]=$!
done
while [ "${#running[@]}" -gt 0 ]; do
	sleep 2
	reap
done
count=$(shards | wc -l)
echo "$((per_job * count)) programs in every mode, $((10 * per_job * count)) in graph mode alone," \
	"$(($(date +%s) - start)) s this invocation"
exit $failed
