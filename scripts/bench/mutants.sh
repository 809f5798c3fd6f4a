#!/usr/bin/env bash
# Framework mutants (scripts/bench/mutants/): realistic one-edit bugs planted in the sharding code of torch
# DTensor, torch tensor parallel, megatron-core, deepspeed, JAX and Colossal-AI; a campaign per mutant, each finding checked
# against the unmutated build. Writes bench-mutants/mutants.csv and .json.
# TIME (per campaign, default 120s), SEED (default 1), MUTANTS (space-separated names, default: all).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q
scripts/setup-python.sh --named main >/dev/null
# The ca-* mutants run in the colossalai environment.
if [[ -z ${MUTANTS:-} || ${MUTANTS:-} == *ca-* ]]; then scripts/setup-python.sh --named colossalai >/dev/null; fi
# shellcheck disable=SC2086
.venv/bin/python scripts/bench/mutants/run.py --time "${TIME:-120s}" --seed "${SEED:-1}" --out bench-mutants ${MUTANTS:-}
