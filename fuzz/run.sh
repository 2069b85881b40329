#!/usr/bin/env bash
# Runs the cargo-fuzz targets for a set time each and prints executions.
#   fuzz/run.sh SECONDS [TARGET...]        (default targets: decode wire resize video)
# Environment: FUZZ_SANITIZER (address; "none" if ASan builds fail),
# FUZZ_NICE (19), FUZZ_EXTRA (more libFuzzer flags, e.g. -jobs=2 -workers=2),
# SEED_EVERY / SEED_MAX_BYTES (seeds.sh sampling), FUZZ_RUNS (stop after
# this many executions, from a fixed FUZZ_SEED (1): what CI runs, so a run
# finds the same things on any machine, however fast; SECONDS then only
# bounds a stuck run).
# Needs cargo-fuzz (`make fuzz` installs it). Stable Rust is enough:
# RUSTC_BOOTSTRAP=1 lets it accept the -Z flags cargo-fuzz passes.
set -uo pipefail
cd "$(dirname "$0")/.."
secs="${1:?usage: fuzz/run.sh SECONDS [TARGET...]}"
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode wire resize video)
export RUSTC_BOOTSTRAP=1
export PIXELWIRE_FUZZ_GUARDED_DIR="$PWD/fuzz/artifacts/guarded"
san="${FUZZ_SANITIZER:-address}"
nice_n="${FUZZ_NICE:-19}"
budget=(-max_total_time="$secs")
[ -z "${FUZZ_RUNS:-}" ] || budget+=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}")

max_len() {
  case "$1" in
    decode) echo 262152 ;;  # 8 header bytes + images up to 256 KiB
    wire) echo 16384 ;;
    resize) echo 4096 ;;    # pixels repeat to fill the source
    video) echo 65540 ;;    # 4 header bytes + files up to 64 KiB
    *) echo 4096 ;;
  esac
}

nice -n "$nice_n" cargo fuzz build --sanitizer "$san" || exit 1
fuzz/seeds.sh

status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/artifacts/$t" "fuzz/artifacts/logs" "fuzz/corpus/$t" "fuzz/regressions/$t"
  log="fuzz/artifacts/logs/$t.log"
  echo "== fuzz $t for ${secs}s (log: $log)"
  # fuzz/regressions/<t> is a second, read-only corpus dir: every past crash
  # is replayed before fuzzing starts.
  # shellcheck disable=SC2086
  nice -n "$nice_n" cargo fuzz run --sanitizer "$san" "$t" "fuzz/corpus/$t" "fuzz/regressions/$t" -- \
    "${budget[@]}" -max_len="$(max_len "$t")" -rss_limit_mb=2048 -timeout=30 \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" ${FUZZ_EXTRA:-} >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  found=$(find "fuzz/artifacts/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)
  line="$t: rc=$rc executions=$execs exec/s=$rate artifacts=$found"
  [ "$rc" -eq 0 ] || {
    status=1
    grep -a -m3 -A2 -E '^==[0-9]+==ERROR|panicked at|ERROR: libFuzzer' "$log" | cut -c1-300 || true
    grep -a -E 'Test unit written to' "$log" | tail -n 1
  }
  echo "$line"
  summary+=("$line")
done
echo "== fuzz summary (${FUZZ_RUNS:+${FUZZ_RUNS} runs, seed ${FUZZ_SEED:-1}, at most }${secs}s per target)"
printf '%s\n' "${summary[@]}" | tee fuzz/artifacts/summary.txt
if [ -d fuzz/artifacts/guarded ]; then
  echo "caught third-party decoder panics (turned into errors by decode::guard): $(find fuzz/artifacts/guarded -type f | wc -l) inputs under fuzz/artifacts/guarded"
fi
exit $status
