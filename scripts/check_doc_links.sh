#!/usr/bin/env bash
# Every reference to a file of the tree in README.md and docs/*.md resolves: markdown links
# ([text](path), relative to the page) and the paths the pages name in the text (zero/engine.h,
# examples/gpt/gpt_model.{h,cc}, //zero/checkpoint:zero_ckpt's package), from the tree's top-level
# folders. Prints each one that does not, with its page and line, and fails.
#   bash scripts/check_doc_links.sh [ROOT]     (ROOT: the repository, default this script's)
# As a test (//:doc_links_test) it is given README.md's runfile, a link into the source tree, and
# checks the tree it lies in (tagged external: it reruns every time, as the files it checks are not
# its inputs).
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
[[ -f $root ]] && root=$(dirname "$(readlink -f "$root")")  # README.md given: the tree it lies in
cd "$root" || exit 1
tops='base|layout|memory|comm|optim|zero|parallel|adapters|examples|tests|scripts|tools|fuzz|testing|docs|third_party'
failed=0 checked=0
resolves() {  # a path, with {a,b} alternatives expanded: a file or folder, or a Bazel target of its package
  local p=$1
  if [[ $p =~ ^(.*)\{([^}]*)\}(.*)$ ]]; then
    local pre=${BASH_REMATCH[1]} alts=${BASH_REMATCH[2]} post=${BASH_REMATCH[3]} a
    IFS=, read -ra parts <<<"$alts"
    for a in "${parts[@]}"; do resolves "$pre$a$post" || return 1; done
    return 0
  fi
  [[ -e $p ]] && return 0
  local build
  build=$(dirname "$p")/BUILD
  [[ -f $build ]] && grep -q "name = \"$(basename "$p")\"" "$build"
}
report() {  # page, line, target
  echo "$1:$2: '$3' does not resolve"
  failed=$((failed + 1))
}
for page in README.md docs/*.md docs/*/*.md; do
  dir=$(dirname "$page")
  # Markdown links, relative to the page; web links and anchors are not files.
  while IFS=: read -r n target; do
    target=${target#](}
    target=${target%)}
    [[ -z $target || $target =~ ^(https?:|mailto:|#) ]] && continue
    target=${target%%#*}
    checked=$((checked + 1))
    [[ -e $dir/$target ]] || report "$page" "$n" "$target"
  done < <(grep -onE '\]\([^) ]+\)' "$page")
  # Paths named in the text, from a top-level folder (not bazel-bin/..., not a label's //). Patterns
  # (llama2_*.json, <name>) and placeholders in capitals (MODEL.json, FILE) name no file.
  while IFS=: read -r n path; do
    [[ $path =~ ^[^A-Za-z0-9_] ]] && path=${path:1}
    path=${path%[.,;]}
    [[ -z $path || $path =~ [*\<\>] || $path == *//* ]] && continue
    if ! resolves "$path" && ! [[ $path =~ /[A-Z]+(\.[a-z]+)?(/|$) ]]; then report "$page" "$n" "$path"; fi
    checked=$((checked + 1))
  done < <(grep -onE "(^|[^A-Za-z0-9_./:@-])($tops)/[A-Za-z0-9_./{},*<>-]*[A-Za-z0-9_}/*>]" "$page")
done
echo "$checked references checked, $failed do not resolve"
((failed == 0))
