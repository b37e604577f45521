# Sourced by the module scripts (tidy.sh, release.sh, consumer.sh): the
# modules of the workspace and the versions they name each other at. Run
# from the repository's root.

# The path every module of this repository starts with.
fk_root_path=github.com/fencekit/fencekit

# fk_modules: the directory of every module in go.work, one per line, the
# root as ".".
fk_modules() {
  go work edit -json | sed -n 's/^[[:space:]]*"DiskPath": "\(.*\)".*/\1/p' | sed 's|^\./||; s|^$|.|'
}

# Modules that are never released: test equipment and companions, built
# only in the workspace. They name their siblings at the version like every
# module, but no tag is made for them and no user fetches them.
fk_unreleased=(bench dbguard/drivertest examples integration internal/rig)

# fk_is_released DIR: DIR's module is tagged by a release.
fk_is_released() {
  [[ " ${fk_unreleased[*]} " != *" $1 "* ]]
}

# fk_module_path DIR: the module path declared in DIR/go.mod.
fk_module_path() {
  sed -n 's/^module[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$1/go.mod"
}

# fk_tag DIR VERSION: the tag the go command looks for when it fetches the
# module in DIR at VERSION (vX.Y.Z for the root, DIR/vX.Y.Z otherwise).
fk_tag() {
  if [ "$1" = "." ]; then echo "$2"; else echo "$1/$2"; fi
}

# fk_ours: reads `go mod edit -json` and prints each path of this
# repository's modules that it names (required, replaced or replacing).
fk_ours() {
  grep -o "\"Path\": \"$fk_root_path[^\"]*\"" | sed 's/"Path": "\(.*\)"/\1/' | sort -u
}

# fk_sibling_requires DIR: the paths of this repository's modules that
# DIR/go.mod requires.
fk_sibling_requires() {
  local self
  self=$(fk_module_path "$1")
  go mod edit -json "$1/go.mod" |
    sed -n '/"Require": \[/,/\]/p' | fk_ours | { grep -vx "$self" || true; }
}

# fk_version: the version the modules name each other at (the core
# module's requirement in cmd/fencekit's go.mod): the release being
# prepared, or the last one made.
fk_version() {
  go mod edit -json cmd/fencekit/go.mod |
    grep -A1 "\"Path\": \"$fk_root_path\"" | sed -n 's/.*"Version": "\(.*\)".*/\1/p' | head -1
}

# fk_valid_version V: V is a semantic version the go command accepts as a
# release tag (vX.Y.Z, or vX.Y.Z-pre).
fk_valid_version() {
  [[ "$1" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]
}

# fk_topo: module directories in dependency order, each after every sibling
# it requires (fails on a cycle or on a requirement outside go.work).
fk_topo() {
  local -A dir_of done_mod
  local dirs=() d dep ok progress left
  mapfile -t dirs < <(fk_modules)
  for d in "${dirs[@]}"; do dir_of[$(fk_module_path "$d")]=$d; done
  left=${#dirs[@]}
  while [ "$left" -gt 0 ]; do
    progress=0
    for d in "${dirs[@]}"; do
      [ -z "${done_mod[$d]:-}" ] || continue
      ok=1
      for dep in $(fk_sibling_requires "$d"); do
        [ -n "${dir_of[$dep]:-}" ] || { echo "modules: $d requires $dep, which is no module of go.work" >&2; return 1; }
        [ -n "${done_mod[${dir_of[$dep]}]:-}" ] || { ok=0; break; }
      done
      if [ "$ok" -eq 1 ]; then echo "$d"; done_mod[$d]=1; left=$((left - 1)); progress=1; fi
    done
    [ "$progress" -eq 1 ] || { echo "modules: the modules require each other in a cycle" >&2; return 1; }
  done
}

# fk_set_versions DIR VERSION: DIR/go.mod names every sibling it requires at
# VERSION and holds no replace directive of this repository's modules.
fk_set_versions() {
  local dir=$1 version=$2 dep args=()
  for dep in $(go mod edit -json "$dir/go.mod" | sed -n '/"Replace": \[/,$p' | fk_ours); do
    args+=(-dropreplace="$dep")
  done
  for dep in $(fk_sibling_requires "$dir"); do args+=(-require="$dep@$version"); done
  [ ${#args[@]} -eq 0 ] || go mod edit "${args[@]}" "$dir/go.mod"
}

# fk_tidy DIR VERSION: go mod tidy in DIR as a release sees it: every
# sibling replaced by its directory for the tidy alone, then named at
# VERSION. go.sum keeps no checksum of a sibling (the workspace joins them
# in development; a release adds them in its own clone).
fk_tidy() {
  local dir=$1 version=$2 d dep rel args=() self
  self=$(fk_module_path "$dir")
  # Forget what the go.mod says of our modules: tidy finds them again.
  for dep in $(go mod edit -json "$dir/go.mod" | fk_ours); do
    [ "$dep" = "$self" ] || args+=(-dropreplace="$dep" -droprequire="$dep")
  done
  for d in $(fk_modules); do
    [ "$d" != "$dir" ] || continue
    rel=$(realpath --relative-to="$dir" "$d")
    case "$rel" in ..*) ;; *) rel=./$rel ;; esac
    args+=(-replace="$(fk_module_path "$d")=$rel")
  done
  go mod edit "${args[@]}" "$dir/go.mod"
  local rc=0
  (cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy) || rc=$?
  fk_set_versions "$dir" "$version"
  return $rc
}

# fk_workspace_pins VERSION: go.work maps each module of ours at VERSION to
# its directory. The go command reads the go.mod of every version a
# workspace module requires, even of a module the workspace holds; until
# VERSION is tagged and fetchable, these version-scoped replacements are
# what lets the workspace build (they never reach a go.mod, nor a user).
fk_workspace_pins() {
  local version=$1 d args=()
  for d in $(go work edit -json | sed -n '/"Replace": \[/,$p' | fk_ours); do
    args+=(-dropreplace="$d")
  done
  [ ${#args[@]} -eq 0 ] || go work edit "${args[@]}"
  args=()
  for d in $(fk_modules); do args+=(-replace="$(fk_module_path "$d")@$version=./$d"); done
  go work edit "${args[@]}"
}

# Test kits: packages of library modules that are fencekit's own test
# equipment (exported only because several modules' tests share them). A
# consumer never imports them; the API report shows them like any package.
fk_testkits=(lease/redislease/redistest lease/etcdlease/etcdtest dynamoguard/dynamotest migrations/migrationstest)

# The module cache the release and consumer checks use: a place of its
# own, so that no earlier copy of a version of ours is ever reused (they
# are removed from it first), and that does not move, so that
# the build cache serves every other module's packages from one run to the
# next.
fk_release_modcache="${XDG_CACHE_HOME:-$HOME/.cache}/fencekit/release-modcache"

# fk_lock_release_cache: waits until no other release or consumer check
# uses the release module cache, and keeps it until this script ends. Each
# run removes the previous run's copies of our modules from the cache
# (fk_forget_ours), so two at once (two checkouts' test commands on one
# machine, say) would pull files from under each other's builds. A script
# started by one that holds the lock (consumer.sh runs release.sh) inherits
# it.
fk_lock_release_cache() {
  [ -z "${FK_RELEASE_CACHE_LOCKED:-}" ] || return 0
  mkdir -p "$(dirname "$fk_release_modcache")"
  exec 9>"$fk_release_modcache.lock"
  if ! flock -n 9; then
    echo "[release] waiting for another release or consumer check to finish with $fk_release_modcache" >&2
    flock 9
  fi
  export FK_RELEASE_CACHE_LOCKED=1
}

# fk_forget_ours: the release module cache holds no module of ours.
fk_forget_ours() {
  chmod -R u+w "$fk_release_modcache" 2>/dev/null || true
  rm -rf "$fk_release_modcache/$fk_root_path" "$fk_release_modcache/$fk_root_path@"* \
    "$fk_release_modcache/cache/download/$fk_root_path" "$fk_release_modcache/cache/vcs"
}

# fk_release_env CLONE: sets the array fk_env, the go command's environment
# in which our modules are fetched from CLONE through git (as they would be
# from github.com, by tag) and every other module from the module proxy,
# served first from this machine's module cache; the workspace is off.
fk_release_env() {
  fk_env=(
    GOWORK=off
    # The go command indexes a module cache's modules once by path and
    # version, as if their files never changed; ours do, from one dry run
    # to the next, so the index is off.
    GODEBUG=goindex=0
    GOFLAGS="-mod=mod -modcacherw -buildvcs=false -trimpath"
    GOPRIVATE="$fk_root_path"
    GONOSUMDB="$fk_root_path"
    GOMODCACHE="$fk_release_modcache"
    GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)"
    GIT_CONFIG_COUNT=1
    GIT_CONFIG_KEY_0="url.$1.insteadOf"
    GIT_CONFIG_VALUE_0="https://$fk_root_path"
  )
}
