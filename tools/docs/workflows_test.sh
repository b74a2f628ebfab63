#!/usr/bin/env bash
# The CI recipes (docs/ci/*.yml) against their schema (docs/ci/workflow.schema.json), and the same
# check refusing a recipe with a misspelled key and one with a step that neither runs nor uses.
set -uo pipefail
check=tools/docs/check_workflows.py
schema=docs/ci/workflow.schema.json
status=0
python3 "$check" "$schema" docs/ci/github-cpu.yml docs/ci/github-gpu.yml || status=1
bad=${TEST_TMPDIR:-/tmp}/bad.yml
sed 's/runs-on:/runs_on:/' docs/ci/github-gpu.yml >"$bad"
out=$(python3 "$check" "$schema" "$bad") && { echo "a misspelled runs-on passed"; status=1; }
grep -q "jobs/gpu: 'runs-on' is a required property" <<<"$out" || { echo "not named: $out"; status=1; }
sed 's/^        run: bash scripts\/gpu_check.sh$/        rum: bash scripts\/gpu_check.sh/' docs/ci/github-gpu.yml >"$bad"
out=$(python3 "$check" "$schema" "$bad") && { echo "a step without run or uses passed"; status=1; }
grep -q "jobs/gpu/steps/3" <<<"$out" || { echo "not named: $out"; status=1; }
exit $status
