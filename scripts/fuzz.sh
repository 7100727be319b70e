#!/usr/bin/env bash
# Runs each coverage-guided fuzz target (fuzz/, cargo-fuzz + libFuzzer) for SECONDS and reports
# executions, corpus size and findings. Needs nightly Rust and cargo-fuzz:
#   rustup toolchain install nightly && cargo install cargo-fuzz
# usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]
# Corpora grow under fuzz/corpus/<target> (seeded from fuzz/seeds/<target>); a crash, hang or
# disagreement is saved under fuzz/artifacts/<target> and the script exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(request_head response_head chunked h1_differential declarative yaml_differential)
fi
cargo +nightly fuzz build "${TARGETS[@]/#/}" >/dev/null 2>&1 || cargo +nightly fuzz build
status=0
printf '| target | seconds | executions | exec/s | corpus files | result |\n|---|---:|---:|---:|---:|---|\n'
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t"
  log="$(mktemp)"
  # -timeout: an input taking longer than 10 s is a hang; -rss_limit_mb: a blow-up is a finding.
  cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  files=$(find "corpus/$t" -type f | wc -l)
  if [ $rc -eq 0 ]; then result="no finding"; else result="FINDING (exit $rc, see fuzz/artifacts/$t)"; status=1; tail -40 "$log" >&2; fi
  printf '| %s | %s | %s | %s | %s | %s |\n' "$t" "$SECONDS_EACH" "${execs:-?}" "${rate:-?}" "$files" "$result"
  rm -f "$log"
done
exit $status
