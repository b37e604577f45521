#!/usr/bin/env bash
# The release as a user meets it. Publishes the committed checkout as a
# release would (scripts/release.sh, a dry run, in a throwaway clone that
# holds the release's tags), then, in a module of its own outside the
# repository, with the workspace off and our modules fetched by the go
# command through git at those tags (every other module from the module
# proxy):
#   - runs the README's install lines (`go get ...@latest`, `go install
#     .../cmd/fencekit@latest`) as they are written, and fails if they miss
#     a released module;
#   - `go get`s every released module at the version, builds and vets a
#     program that imports every public package (the test kits aside)
#     and the README's quick start, and runs the installed command;
#   - fails if the program's module graph holds a module of ours that the
#     release did not tag, or one at another version;
#   - checks the module rule as a user meets it (scripts/modrule.sh
#     --release): a program importing one library module inherits no other
#     store's client.
#
#   ./scripts/consumer.sh           # at the version the modules name each other at
#                                   # (the next minor one if that is tagged here already)
#   ./scripts/consumer.sh v0.3.0    # as if v0.3.0 were released now
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. scripts/lib/modules.sh
say() { printf '[consumer] %s\n' "$*" >&2; }
fail() { printf '[consumer] FAIL: %s\n' "$*" >&2; exit 1; }

version=${1:-}
if [ -z "$version" ]; then
  version=$(fk_version)
  if git rev-parse -q --verify "refs/tags/$version" >/dev/null; then
    IFS=. read -r major minor _ <<<"${version#v}"
    version="v$major.$((minor + 1)).0"
  fi
fi
fk_valid_version "$version" || fail "$version is not a semantic version"

work=$(mktemp -d "${TMPDIR:-/tmp}/fencekit-consumer.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

fk_lock_release_cache
say "release $version (dry run) of $(git rev-parse --short HEAD) into a throwaway clone"
./scripts/release.sh "$version" --out "$work/release" >"$work/release.log" 2>&1 || {
  cat "$work/release.log" >&2; fail "the release dry run failed (above)"; }
sed -n '/^== tags/,/^== CHANGELOG/p' "$work/release.log" | sed '$d'

released=()
for dir in $(fk_modules); do ! fk_is_released "$dir" || released+=("$dir"); done

fk_release_env "$work/release"
export "${fk_env[@]}"
export GOBIN=$work/bin
consumer=$work/consumer
mkdir -p "$consumer"
cd "$consumer"
printf 'module example.com/consumer\n\ngo 1.26.0\n' >go.mod

# 1. The README's install lines, as written.
mapfile -t lines < <(grep -E "^go (get|install) $fk_root_path" "$repo/README.md" | sed 's/[[:space:]]*#.*$//')
[ ${#lines[@]} -gt 0 ] || fail "README.md has no install lines (go get $fk_root_path...)"
for dir in "${released[@]}"; do
  # An internal module (code the library modules share) is fetched as
  # their requirement; no user names it.
  [[ "$dir" != internal/* ]] || continue
  path=$(cd "$repo" && fk_module_path "$dir")
  printf '%s\n' "${lines[@]}" | grep -Eq " $path(/[^ ]*)?@" ||
    fail "README.md's install lines do not name $path"
done
for line in "${lines[@]}"; do
  say "+ $line"
  read -ra cmd <<<"$line"
  "${cmd[@]}" 2>"$work/err" || { cat "$work/err" >&2; fail "README install line failed: $line"; }
done
"$GOBIN/fencekit" -h >"$work/help" 2>&1 || true
grep -q 'fencekit migrate up' "$work/help" || { cat "$work/help" >&2; fail "the installed fencekit command does not run"; }

# 2. Every released module at the version, every public package imported.
imports=()
for dir in "${released[@]}"; do
  path=$(cd "$repo" && fk_module_path "$dir")
  go get "$path@$version" 2>"$work/err" || { cat "$work/err" >&2; fail "go get $path@$version"; }
  mapfile -t pkgs < <(cd "$repo/$dir" && GOWORK="$repo/go.work" GOFLAGS=-buildvcs=false go list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./...)
  for p in "${pkgs[@]}"; do
    [ -n "$p" ] || continue
    [[ "$p" != */internal/* && "$p" != */internal ]] || continue
    kit=0
    for k in "${fk_testkits[@]}"; do [ "$p" != "$fk_root_path/$k" ] || kit=1; done
    [ "$kit" -eq 1 ] || imports+=("$p")
  done
done
{
  echo "// Command consumer imports every public package of fencekit's release."
  echo "package main"
  echo
  echo "import ("
  for p in "${imports[@]}"; do echo "	_ \"$p\""; done
  echo ")"
  echo
  echo "func main() {}"
} >main.go
# The README's quick start, as written, beside it.
mkdir -p quickstart
awk '/^```go$/ { on = 1; next } on && /^```$/ { exit } on' "$repo/README.md" >quickstart/main.go
grep -q '^package main' quickstart/main.go || fail "README.md has no Go quick start (a \`\`\`go block)"
go mod tidy 2>"$work/err" || { cat "$work/err" >&2; fail "go mod tidy in the consumer"; }
GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath" go build ./... 2>"$work/err" || { cat "$work/err" >&2; fail "the consumer does not build"; }
GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath" go vet ./... 2>"$work/err" || { cat "$work/err" >&2; fail "the consumer does not vet"; }
say "a program importing ${#imports[@]} public packages of ${#released[@]} modules, and the README's quick start, build and vet"

# 3. Only released modules of ours, all at the version.
while read -r mod ver; do
  ok=0
  for dir in "${released[@]}"; do
    [ "$mod" != "$(cd "$repo" && fk_module_path "$dir")" ] || ok=1
  done
  [ "$ok" -eq 1 ] || fail "the consumer's graph holds $mod, which the release does not tag"
  [ "$ver" = "$version" ] || fail "the consumer's graph holds $mod at $ver, not $version"
done < <(go list -m all | grep "^$fk_root_path" || true)
if grep -v "^$fk_root_path" go.sum | grep -q "$fk_root_path"; then fail "go.sum names a module of ours oddly"; fi
say "go.sum lists $(grep -c "^$fk_root_path" go.sum) lines of ours, all released modules at $version; the whole graph has $(go list -m all | wc -l) modules"

# 4. The module rule, as a user meets it.
cd "$repo"
./scripts/modrule.sh --release "$version"
say "ok: $version installs from outside the repository"
