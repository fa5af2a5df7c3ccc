#!/usr/bin/env bash
# Regenerate the Go tools modules that build the test control plane (a maintainer's step;
# the build reads the committed go.mod/go.sum files and never runs this).
#
# Each component gets a module of its own, so each builds against the Kubernetes libraries
# its own release was tested with (Kueue v0.17 is on k8s.io/* v0.35, JobSet v0.12 on v0.36).
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io/* staging
# module with ./staging/... at v0.0.0. Its module here requires it and replaces each
# staging module with the published v0.<minor>.<patch>, the list read from that go.mod.
set -euo pipefail
cd "$(dirname "$0")"
. ../versions.env
export GOFLAGS=-mod=mod GOTOOLCHAIN=local

mkmod() {  # mkmod DIR MODULE@VERSION TOOL...
  local dir=$1 req=$2; shift 2
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && go mod init "xrun.dev/cluster-tools/$dir" >/dev/null 2>&1 && go mod edit -go=1.26.0)
  if [ "$dir" = kube ]; then
    local mod staging
    mod=$(go mod download -json "$req" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    staging="v0.${KUBE_VERSION#v1.}"
    grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$mod" | awk '{print $1}' | while read -r m; do
      (cd "$dir" && go mod edit -replace "$m=$m@$staging")
    done
  fi
  (cd "$dir" && go get "$req" && for t in "$@"; do go get -tool "$t@${req#*@}"; done && go mod tidy)
}

mkmod kube "k8s.io/kubernetes@$KUBE_VERSION" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler
mkmod etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION" go.etcd.io/etcd/server/v3
mkmod jobset "sigs.k8s.io/jobset@$JOBSET_VERSION" sigs.k8s.io/jobset
mkmod kueue "sigs.k8s.io/kueue@$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
mkmod kwok "sigs.k8s.io/kwok@$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
mkmod fakegcs "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION" github.com/fsouza/fake-gcs-server
