# Makefile fragment: `include tools/kube/kube.mk` from the main Makefile (repository root).
# Builds (once) kube-apiserver and kube-controller-manager v1.20.2 into
# $${WARMGATE_KUBE_CACHE:-/var/cache/warmgate-kube}/v1.20.2/ for the tests/kube suite;
# exits at once when they are already cached. Recipe: tools/kube/build.sh.

.PHONY: kube-bins
kube-bins:
	bash tools/kube/build.sh
