#!/usr/bin/env bash
# Cuts a release of fencekit's modules at one version, the way
# the go command will fetch it: each go.mod names its siblings at the
# version (no replace directive), each go.sum holds their checksums, the
# CHANGELOG's "Unreleased" section moves under the version, and each module
# gets its tag (vX.Y.Z for the root, DIR/vX.Y.Z for the others). Every
# module of go.work is released but the test equipment and companions
# (bench, dbguard/drivertest, examples, integration, internal/rig:
# scripts/lib/modules.sh),
# which are built only in the workspace.
#
# By default it is a dry run: everything happens in a throwaway clone of
# the committed HEAD, is checked there, and is reported; the repository is
# not touched.
#
#   ./scripts/release.sh v0.2.0              # dry run: tags, checks, API report
#   ./scripts/release.sh v0.2.0 --out DIR    # dry run, keeping the release clone in DIR
#   ./scripts/release.sh v0.2.0 --apply      # the same, then the release commit and
#                                            # tags land in this repository (not pushed)
#
# Checks, in the release clone, with the workspace off and every module of
# ours fetched by the go command through git at the new tags: each
# module's `go vet ./...` (which type-checks its packages and tests). The API report compares each
# module's exported API with the previous release's tag (apidiff, from the
# Go module proxy); a patch release with an incompatible change fails, and
# a minor release's incompatible changes are listed in the CHANGELOG.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. scripts/lib/modules.sh

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
version="" apply=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
  --apply) apply=1 ;;
  --out) out=${2:?--out needs a directory}; shift ;;
  -h|--help) usage ;;
  -*) echo "release: unknown flag $1" >&2; usage ;;
  *) [ -z "$version" ] || usage; version=$1 ;;
  esac
  shift
done
[ -n "$version" ] || usage
fk_valid_version "$version" || { echo "release: $version is not a semantic version (vX.Y.Z)" >&2; exit 2; }
say() { printf '[release] %s\n' "$*" >&2; }

if git rev-parse -q --verify "refs/tags/$version" >/dev/null; then
  echo "release: tag $version exists already" >&2; exit 1
fi
if [ "$apply" -eq 1 ] && [ -n "$(git status --porcelain)" ]; then
  echo "release: --apply needs a clean work tree (commit or stash first)" >&2; exit 1
fi

# The previous release: the highest root tag below this version.
previous=$(git tag -l 'v*' | { grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' || true; } | sort -V | awk -v v="$version" '
  { if ($0 == v) exit; last = $0 } END { print last }')
if [ -n "$previous" ] && [ "$(printf '%s\n%s\n' "$previous" "$version" | sort -V | tail -1)" != "$version" ]; then
  echo "release: $version is not above the previous release $previous" >&2; exit 1
fi
kind=minor
if [ -n "$previous" ]; then
  IFS=. read -r pmaj pmin _ <<<"${previous#v}"
  IFS=. read -r vmaj vmin _ <<<"${version#v}"
  vmin=${vmin%%-*}
  if [ "$pmaj" = "$vmaj" ] && [ "$pmin" = "$vmin" ]; then kind=patch; fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fencekit-release.XXXXXX")
cleanup() {
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
clone=$work/repo
if [ -n "$out" ]; then
  rm -rf "$out"; mkdir -p "$(dirname "$out")"
  clone=$(realpath -m "$out")
fi
git clone -q --no-hardlinks "$repo" "$clone"
git -C "$clone" tag -l | xargs -r git -C "$clone" tag -d >/dev/null
git -C "$clone" config user.name "fencekit release"
git -C "$clone" config user.email "release@fencekit.invalid"
base=$(git -C "$clone" rev-parse HEAD)
say "release $version of $(git rev-parse --short HEAD) (previous: ${previous:-none}, a $kind release)"

# The go command fetches our modules from the clone through git, every
# other module from the module proxy (scripts/lib/modules.sh).
fk_lock_release_cache
fk_forget_ours
fk_release_env "$clone"
goenv=("${fk_env[@]}")

cd "$clone"
mapfile -t all < <(fk_topo)
order=()
for dir in "${all[@]}"; do ! fk_is_released "$dir" || order+=("$dir"); done

# 1. Every go.mod names its siblings at the version; go.work pins them.
for dir in "${all[@]}"; do fk_set_versions "$dir" "$version"; done
fk_workspace_pins "$version"

# 2. The CHANGELOG's "Unreleased" section becomes the version's.
today=$(date -u +%Y-%m-%d)
grep -q '^## Unreleased' CHANGELOG.md || { echo "release: CHANGELOG.md has no '## Unreleased' section" >&2; exit 1; }
awk -v v="$version" -v d="$today" '
  /^## Unreleased/ && !done { print "## Unreleased"; print ""; print "## " v " (" d ")"; done = 1; next }
  { print }' CHANGELOG.md >CHANGELOG.md.new && mv CHANGELOG.md.new CHANGELOG.md
git add -A && git commit -qm "Release $version (modules name each other at $version)"

# 3. Checksums. In dependency order, each module is tidied against its
# siblings' tags (its go.sum gains their checksums), committed and
# tagged; a module is tagged only once its content is final, so the
# modules after it fetch the very files the release holds.
for dir in "${order[@]}"; do
  (cd "$dir" && env "${goenv[@]}" go mod tidy) 2>"$work/err" || {
    cat "$work/err" >&2; echo "release: go mod tidy failed in $dir" >&2; exit 1; }
  fk_set_versions "$dir" "$version"
  git add -A
  git diff --cached --quiet || git commit -qm "$dir: checksums of its siblings at $version"
  git tag "$(fk_tag "$dir" "$version")"
done

# One release commit: the chain above squashed. Each module's files are
# the same as at its tag, so every tag moves to it with the same content.
git reset -q --soft "$base"
git commit -qm "Release $version" -m "Every module names its siblings at $version; CHANGELOG: the Unreleased section is $version's."
for dir in "${order[@]}"; do
  tag=$(fk_tag "$dir" "$version")
  # The module's files, without the modules nested in its directory.
  spec=("$dir")
  for sub in "${all[@]}"; do
    if [ "$dir" = "." ] && [ "$sub" != "." ] || [[ "$sub" == "$dir/"* ]]; then spec+=(":(exclude)$sub"); fi
  done
  git diff --quiet "$tag" HEAD -- "${spec[@]}" || { echo "release: $dir changed after it was tagged" >&2; exit 1; }
  git tag -f -a -m "fencekit $version: $(fk_module_path "$dir")" "$tag" HEAD >/dev/null
done

# 4. Checks, with a fresh module cache: every module builds and vets with
# the workspace off, its siblings fetched at the tags.
fk_forget_ours
for dir in "${order[@]}"; do
  # go vet type-checks every package and its tests, compiling what they
  # import; a go build beside it would add only the links of the commands
  # (the consumer check installs cmd/fencekit from the tags).
  say "check $dir: GOWORK=off go vet ./..."
  (cd "$dir" && env "${goenv[@]}" GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath" go vet ./...) 2>"$work/err" || {
    cat "$work/err" >&2; echo "release: $dir does not type-check (go vet) on its own at $version" >&2; exit 1; }
done
[ -z "$(git status --porcelain)" ] || { git status --short >&2; echo "release: the checks changed files (go.mod or go.sum not final)" >&2; exit 1; }

# 5. The API report, module by module, against the previous release.
apidiff_version=v0.0.0-20261113113407-e3970619a1a4
apidiff="${XDG_CACHE_HOME:-$HOME/.cache}/fencekit/bin/apidiff-$apidiff_version"
report=$work/api.txt
: >"$report"
incompatible=$work/incompatible.md
: >"$incompatible"
if [ -z "$previous" ]; then
  echo "API: no previous release; $version is the first, so no module's API is compared." >>"$report"
else
  if [ ! -x "$apidiff" ]; then
    say "go install golang.org/x/exp/cmd/apidiff@$apidiff_version"
    gobin=$(mktemp -d)
    (cd "$work" && GOWORK=off GOBIN="$gobin" GOFLAGS=-buildvcs=false go install "golang.org/x/exp/cmd/apidiff@$apidiff_version")
    mkdir -p "$(dirname "$apidiff")"; mv "$gobin/apidiff" "$apidiff"; rmdir "$gobin"
  fi
  old=$work/old
  git -C "$repo" worktree add -q --detach "$old" "$previous"
  trap 'git -C "$repo" worktree remove --force "$old" 2>/dev/null; cleanup' EXIT
  # Each side is read with the workspace off, as a user's build sees it:
  # the previous release's siblings from this repository's tags, then the
  # new one's from the release clone.
  oldenv=("${goenv[@]}" GIT_CONFIG_KEY_0="url.$repo.insteadOf" GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath")
  newenv=("${goenv[@]}" GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath")
  mkdir -p "$work/api"
  for dir in "${order[@]}"; do
    [ -f "$old/$dir/go.mod" ] || continue
    x=$work/api/$(tr / _ <<<"$dir")
    path=$(fk_module_path "$dir")
    (cd "$old/$dir" && env "${oldenv[@]}" "$apidiff" -m -w "$x.old" "$path") 2>"$work/err" || {
      cat "$work/err" >&2; echo "release: apidiff could not read $dir at $previous" >&2; exit 1; }
  done
  fk_forget_ours
  for dir in "${order[@]}"; do
    path=$(fk_module_path "$dir")
    x=$work/api/$(tr / _ <<<"$dir")
    if [ ! -f "$x.old" ]; then
      echo "$path: new module (not in $previous)" >>"$report"; continue
    fi
    (cd "$clone/$dir" && env "${newenv[@]}" "$apidiff" -m -w "$x.new" "$path") 2>"$work/err" || {
      cat "$work/err" >&2; echo "release: apidiff could not read $dir at $version" >&2; exit 1; }
    changes=$("$apidiff" -m "$x.old" "$x.new")
    inc=$("$apidiff" -m -incompatible "$x.old" "$x.new")
    if [ -z "$changes" ]; then
      echo "$path: no API change" >>"$report"
    else
      { echo "$path:"; sed 's/^/  /' <<<"$changes"; } >>"$report"
    fi
    if [ -n "$inc" ]; then
      { echo "- \`$path\`:"; grep -v '^Incompatible changes:$' <<<"$inc" | sed 's/^[- ]*/  - /'; } >>"$incompatible"
    fi
  done
  if [ -s "$incompatible" ]; then
    if [ "$kind" = patch ]; then
      cat "$report" >&2
      echo "release: $version is a patch release, but the API changed incompatibly (above)" >&2; exit 1
    fi
    # The minor release's incompatible changes go under its heading.
    awk -v v="$version" -v f="$incompatible" '
      { print }
      $0 ~ "^## " v " " && !done { print ""; print "### Incompatible API changes (apidiff against the previous release)"; print "";
        while ((getline l < f) > 0) print l; done = 1 }' CHANGELOG.md >CHANGELOG.md.new && mv CHANGELOG.md.new CHANGELOG.md
    git commit -qam "Release $version" --amend --no-edit
    for dir in "${order[@]}"; do git tag -f -a -m "fencekit $version: $(fk_module_path "$dir")" "$(fk_tag "$dir" "$version")" HEAD >/dev/null; done
  fi
fi

echo "== release $version: $(git rev-parse --short HEAD) on $(git -C "$repo" rev-parse --short HEAD)"
echo "== tags"
for dir in "${order[@]}"; do echo "  $(fk_tag "$dir" "$version")"; done
echo "== API report (against ${previous:-nothing})"
cat "$report"
echo "== CHANGELOG"
git diff "$base" HEAD -- CHANGELOG.md | sed -n '/^@@/,$p' | head -40

cd "$repo"
if [ "$apply" -eq 1 ]; then
  git fetch -q "$clone" HEAD
  git merge -q --ff-only FETCH_HEAD
  for dir in "${order[@]}"; do
    git fetch -q "$clone" "refs/tags/$(fk_tag "$dir" "$version"):refs/tags/$(fk_tag "$dir" "$version")"
  done
  echo "== applied: the release commit and $(( ${#order[@]} )) tags are in this repository. To publish:"
  echo "  git push origin HEAD $(for dir in "${order[@]}"; do printf '%s ' "$(fk_tag "$dir" "$version")"; done)"
else
  echo "== dry run: nothing changed here${out:+; the release clone is in $out}"
fi
