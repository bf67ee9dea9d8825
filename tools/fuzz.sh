#!/usr/bin/env bash
# `make fuzz`: the differential random-program tester at scale, split over FUZZ_JOBS processes
# (one per core by default; each program is one IREE compile on one core). Job k runs
# FUZZ_EXAMPLES/FUZZ_JOBS programs from seed SEED+k, so the whole run is reproducible from SEED.
set -u
examples=${FUZZ_EXAMPLES:-1000}
jobs=${FUZZ_JOBS:-$(nproc)}
seed=${GRADLOOP_FUZZ_SEED:-$(python3 -c 'import random; print(random.randrange(2**31))')}
per_job=$(( (examples + jobs - 1) / jobs ))
logs=$(mktemp -d)
echo "GRADLOOP_FUZZ_SEED=$seed: $jobs jobs of $per_job programs (logs in $logs)"
start=$(date +%s)
pids=()
for k in $(seq 0 $((jobs - 1))); do
	GRADLOOP_FUZZ_SEED=$((seed + k)) GRADLOOP_FUZZ_EXAMPLES=$per_job GRADLOOP_FUZZ_HEAVY=1 \
		python -m pytest -q -x -p no:cacheprovider --hypothesis-show-statistics \
		tests/test_fuzz_modes.py::test_modes_agree_on_random_programs \
		tests/test_fuzz_modes.py::test_graph_mode_agrees_on_many_random_programs \
		>"$logs/job$k.log" 2>&1 &
	pids+=($!)
done
failed=0
for k in "${!pids[@]}"; do
	if wait "${pids[$k]}"; then
		echo "job $k (GRADLOOP_FUZZ_SEED=$((seed + k))): $(tail -n 1 "$logs/job$k.log")"
	else
		failed=1
		echo "job $k FAILED (reproduce with GRADLOOP_FUZZ_SEED=$((seed + k)) GRADLOOP_FUZZ_EXAMPLES=$per_job):"
		grep -v "FormWarning\|results = stage" "$logs/job$k.log" | tail -n 40
	fi
done
echo "$((per_job * jobs)) programs in every mode, $((10 * per_job * jobs)) in graph mode alone," \
	"$(($(date +%s) - start)) s"
exit $failed
