# stager: the two commands of the quick start are `make demo` and `make test`.
# Each creates .venv and installs what it needs when missing.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
# Mosaic Streaming (tests/test_s3_mosaic.py, `python -m bench mosaic`) in a venv of its own:
# it pins numpy<2.2 and imports torchvision at `import streaming`, and PyPI's torchvision
# loads only beside a CUDA build of torch (the CPU torch 2.13.0 fails: `operator
# torchvision::nms does not exist`).  torch 2.14.1 and torchvision 0.29.1 lie on this
# machine's disk for Python 3.11 (about 5.5 GB installed, a few minutes).
MOSAIC  := .venv-mosaic
MOSAIC_PACKAGES ?= torch==2.14.1 torchvision==0.29.1 mosaicml-streaming==0.13.0
# Debian packages the tests use (FUSE mounts, nginx baselines, network namespaces,
# fault injection: fiu-run, the PostgreSQL metadata store's tests: initdb, pg_ctl,
# a real Slurm with burst buffers: tests/slurm/, the dashboard in a headless browser,
# rclone against the S3 endpoint: tests/test_s3_rclone.py).
APT_PACKAGES ?= iproute2 nginx-light iperf3 fuse3 libfuse3-dev pkg-config fio fiu-utils postgresql \
	slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins \
	chromium chromium-driver curl systemd docker.io debootstrap rclone

# The test runs: modules in parallel (pytest-xdist; a module's tests stay on one worker,
# modules sharing what cannot run twice name one xdist_group, see tests/conftest.py), on
# as many workers as cores, at most 4.  The slowest tests are printed at the end.
PYTEST   := $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup \
	--no-loadscope-reorder

.PHONY: pidspace demo test check lint sysdeps bench bench-quick clean

$(BIN)/python:
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "stager needs Python 3.11 or newer")'
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e .
	@touch $@

# The fuse extra (pyfuse3) compiles against libfuse3, so it comes after sysdeps;
# where it cannot build, the FUSE tests skip and say why.
# The torch extra first, alone: so pip takes the CPU build of torch 2.13.0 where this
# machine has one on disk (find-links), which the next line then keeps.  Asked for with
# the dev extra, pip's resolver picked PyPI's CUDA build of the same version (3.4 GB
# more of nvidia-* and triton in the venv).
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python sysdeps
	$(PIP) install -q -e '.[torch]'
	$(PIP) install -q -e '.[dev,bench,torch]'
	$(PIP) install -q -e '.[fuse]' || echo "pyfuse3 did not build (needs libfuse3-dev and pkg-config): the FUSE tests will skip"
	@touch $@ $(VENV)/.installed

# Where it cannot be installed, the Mosaic tests skip and say why (and --strict-skips
# fails the run: CI is meant to have it).
$(MOSAIC)/.installed:
	$(PY) -m venv $(MOSAIC)
	$(MOSAIC)/bin/python -m pip install -q --upgrade pip
	$(MOSAIC)/bin/python -m pip install -q $(MOSAIC_PACKAGES) || echo "mosaicml-streaming did not install in $(MOSAIC): the Mosaic tests will skip"
	@touch $@

demo: $(VENV)/.installed
	$(BIN)/python -m stager.demo

# The whole suite, as CI runs it (.ci/run).  Every skip is printed with its reason (-rs),
# and one outside tests/skip_budget.py's short list fails the run (--strict-skips).
# The two venvs install side by side (a sub-make with -j2: pip waits on the registry
# and the disk as much as on a core).
test: sysdeps pidspace
	$(MAKE) -j2 --no-print-directory $(VENV)/.installed-dev $(MOSAIC)/.installed
	$(PYTEST) -rs --strict-skips --durations=30

# The suite starts and kills thousands of processes on a small machine, and Slurm's
# proctrack/pgid signals a step's process group by number: with the kernel's default
# 32768 pids (here they wrap every few minutes under the suite) a stale number can
# name a server another test just started.  As root, widen the pid space to the
# 64-bit kernel's limit (as systemd does on boot); otherwise leave it as it is.
pidspace:
	@if [ "$$(id -u)" = 0 ] && [ -w /proc/sys/kernel/pid_max ] && \
	    [ "$$(cat /proc/sys/kernel/pid_max)" -lt 4194304 ]; then \
		echo 4194304 > /proc/sys/kernel/pid_max && echo "kernel.pid_max = 4194304"; fi

# The fast tier to run after each change (under 3 minutes): unit tests and in-process
# clusters on SQLite.  Not what starts processes (modules marked slow: the CLI, stager
# up, Slurm, Docker, a browser, network namespaces), FUSE, the fault scenarios or the
# PostgreSQL runs of the store-parametrised tests: `make test` runs those.
check: $(VENV)/.installed-dev
	$(PYTEST) -m "not slow and not faults and not fuse" -k "not postgresql" --durations=15

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check stager tests bench clients

# Installs missing Debian packages when running as root with apt; otherwise says
# what is missing and carries on (the tests that need them skip, saying why).
sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing:$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "not root or no apt-get; missing Debian packages:$$missing (their tests will skip)"; fi

# The benchmarks (see bench/RESULTS.md); bench-quick is the smoke-test size and
# writes to .stager/bench-quick so the committed results stay as they are.
bench: $(VENV)/.installed-dev $(MOSAIC)/.installed sysdeps
	$(BIN)/python -m bench

bench-quick: $(VENV)/.installed-dev $(MOSAIC)/.installed sysdeps
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) $(MOSAIC) .stager .pytest_cache
