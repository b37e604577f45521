#!/usr/bin/env bash
# go mod tidy for every module of the workspace, as a release sees them:
# each go.mod names its siblings at one version (default: the version they
# name each other at now; see scripts/lib/modules.sh) and holds no replace
# directive. Run it after changing imports across modules.
#
#   ./scripts/tidy.sh           # every module, siblings at their version
#   ./scripts/tidy.sh v0.2.0    # every module, siblings named at v0.2.0
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/modules.sh
version=${1:-$(fk_version)}
fk_valid_version "$version" || { echo "tidy: $version is not a semantic version (vX.Y.Z)" >&2; exit 2; }
for dir in $(fk_modules); do
  echo "+ tidy $dir (siblings at $version)"
  fk_tidy "$dir" "$version"
done
fk_workspace_pins "$version"
