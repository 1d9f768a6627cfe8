# idemproxy - build, test, demo. `make` builds; `make deps` installs what is missing.

CC       ?= cc
PKGS      = hiredis libprotobuf-c yaml-0.1 json-c libmicrohttpd openssl libcurl
WARN      = -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wwrite-strings -Werror
OPT      ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -MMD -MP -Iproxy -I$(B)/gen
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lev -lm -pthread
ifdef SANITIZE
CFLAGS   += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -DPX_DEBUG
LDFLAGS  += -fsanitize=$(SANITIZE)
endif

B         = build
GEN       = $(B)/gen/idemproxy/v1/idemproxy.pb-c
PROXY_SRC = $(wildcard proxy/*.c)
PROXY_OBJ = $(patsubst proxy/%.c,$(B)/proxy/%.o,$(PROXY_SRC)) $(GEN).o
LIB_OBJ   = $(filter-out $(B)/proxy/main.o,$(PROXY_OBJ))

UNIT      = $(patsubst tests/unit/test_%.c,$(B)/tests/test_%,$(wildcard tests/unit/test_*.c))

.PHONY: all deps test test-fault chaos fuzz unit demo demo-db bench clean clients-c proto-copies sql-copies \
        license-copies version-copies images
all: $(B)/idemproxy clients-c

$(GEN).h: $(GEN).c
$(GEN).c: proto/idemproxy/v1/idemproxy.proto
	@mkdir -p $(B)/gen
	protoc-c --proto_path=proto --c_out=$(B)/gen $<

$(GEN).o: $(GEN).c
	$(CC) -std=c11 $(OPT) -I$(B)/gen -c -o $@ $<

$(B)/proxy/%.o: proxy/%.c $(GEN).h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# The commit built, for `idemproxy version` ("" outside a git checkout). The
# header is rewritten only when it changes, so main.o is rebuilt only then.
COMMIT   ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
$(B)/gen/git_commit.h: FORCE
	@mkdir -p $(B)/gen
	@echo '#define PX_COMMIT "$(COMMIT)"' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(B)/proxy/main.o $(B)/proxy/metrics.o: $(B)/gen/git_commit.h
FORCE:

$(B)/idemproxy: $(PROXY_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Each unit test links only the modules it tests (listed here).
$(B)/tests/test_template: $(B)/proxy/template.o $(B)/proxy/px.o
$(B)/tests/test_config:   $(B)/proxy/config.o $(B)/proxy/addr.o $(B)/proxy/template.o $(B)/proxy/px.o
$(B)/tests/test_decide:   $(B)/proxy/decide.o
$(B)/tests/test_codec:    $(B)/proxy/codec.o $(B)/proxy/px.o $(GEN).o
$(B)/tests/test_reply:    $(B)/proxy/reply.o $(B)/proxy/px.o
$(B)/tests/test_jscan:    $(B)/proxy/jscan.o $(B)/proxy/px.o
$(B)/tests/test_px:       $(B)/proxy/px.o
$(B)/tests/test_event:    $(B)/proxy/event.o $(B)/proxy/jscan.o $(B)/proxy/template.o $(B)/proxy/px.o
$(B)/tests/test_addr:     $(B)/proxy/addr.o
$(B)/tests/test_trace:    $(B)/proxy/trace.o $(B)/proxy/log.o $(B)/proxy/px.o
$(B)/tests/test_sentinel: $(B)/proxy/sentinel_reply.o
$(B)/tests/test_replies:  $(B)/proxy/replies.o $(B)/proxy/decide.o $(B)/proxy/px.o
$(B)/tests/test_entry:    $(B)/proxy/entry.o $(B)/proxy/log.o $(B)/proxy/px.o
# The reader against a stand-in for its links and the hub (in the test).
$(B)/tests/test_reader:   $(B)/proxy/reader.o $(B)/proxy/slots.o $(B)/proxy/addr.o $(B)/proxy/replies.o $(B)/proxy/entry.o $(B)/proxy/decide.o $(B)/proxy/hooks.o $(B)/proxy/log.o $(B)/proxy/px.o
$(B)/tests/test_cluster:  $(LIB_OBJ)
$(B)/tests/test_sp:       $(B)/proxy/sp.o $(B)/proxy/spframe.o $(B)/proxy/addr.o $(B)/proxy/log.o $(B)/proxy/px.o $(B)/proxy/hooks.o
$(B)/tests/test_redis:    $(LIB_OBJ)
$(B)/tests/test_%: tests/unit/test_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

unit: $(UNIT)

clients-c:
	$(MAKE) -C clients/c

deps:
	./tests/deps.sh

test: deps all unit
	./tests/run

# The fault suite alone at full size (1,000+ entries a scenario), as `make test` runs it.
test-fault: deps all
	FAULT_FULL=1 .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/fault

# Seeded chaos (tests/chaos/README.md): SEEDS seeds from FROM, or the one SEED.
# A failure prints its seed and the command that replays it. With an ASan build:
# make chaos B=build-asan SANITIZE=address SEEDS=50. CLUSTER=1: against a Redis
# Cluster, with failovers, a master killed and slots migrated. JOBS=N: N seeds at a
# time, each in its own process. TLS=1: every proxy over mutual TLS. NET=1: each
# proxy through a forwarder that loses or holds chosen replies. DB=1: workers write
# their effects into PostgreSQL through the inbox and fence, and Redis may forget
# (MUTANT=skip-fence: a helper without its fence). `make test` runs a fixed set.
SEEDS ?= 20
FROM  ?= 0
chaos: deps all
	.venv/bin/python tests/chaos/chaos.py --bin $(B)/idemproxy $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --from $(FROM)) $(if $(CLUSTER),--cluster) $(if $(TLS),--tls) $(if $(NET),--net) $(if $(DB),--db) $(if $(MUTANT),--mutant $(MUTANT)) $(if $(JOBS),--jobs $(JOBS))

# libFuzzer targets (tests/fuzz/), 60 s each; `make test` runs them 10 s each.
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./tests/fuzz/run.sh

# idemproxy against its baselines, one local redis-server, one run; prints the
# table and writes build/bench/results.md. Never part of `make test`. Knobs: bench/run.py.
bench: deps all
	$(MAKE) -C bench
	.venv/bin/python bench/run.py

# Packages that must carry the wire schema hold a copy of proto/'s (tests/packaging checks them).
proto-copies:
	@find clients -name idemproxy.proto -not -path '*/node_modules/*' -not -path '*/target/*' \
	  -not -path '*/build/*' -exec cp proto/idemproxy/v1/idemproxy.proto {} \; -print

# Every client's copy of the inbox and fence tables (docs/database.md).
sql-copies:
	@find clients -name 001_idemproxy_inbox.sql -not -path '*/node_modules/*' -not -path '*/target/*' \
	  -not -path '*/build/*' -not -path '*/.venv/*' -not -path '*/dist/*' \
	  -exec cp sql/postgresql/001_idemproxy_inbox.sql {} \; -print

# Every client package carries the license text (tests/packaging/test_manifests.py checks them).
license-copies:
	@for c in clients/*/; do cp LICENSE $$c; echo $${c}LICENSE; done

# VERSION is the one version of the daemon and of every client package: this writes it
# into each manifest (tests/packaging/test_manifests.py checks that they all say it).
# The Go module's versions are its git tags, clients/go/vX.Y.Z.
PKG_VERSION = $(shell cat VERSION)
version-copies:
	sed -i 's/^#define PX_VERSION ".*"/#define PX_VERSION "$(PKG_VERSION)"/' proxy/px.h
	sed -i 's/^VERSION\( *\)= .*/VERSION\1= $(PKG_VERSION)/' clients/c/Makefile clients/java/Makefile
	sed -i '0,/<version>/s|<version>[^<]*</version>|<version>$(PKG_VERSION)</version>|' clients/java/pom.xml
	sed -i '0,/"version": /s/"version": "[^"]*"/"version": "$(PKG_VERSION)"/' clients/node/package.json
	sed -i '0,/"version": /s/"version": "[^"]*"/"version": "$(PKG_VERSION)"/; /^    "": {/,/"version": /s/"version": "[^"]*"/"version": "$(PKG_VERSION)"/' clients/node/package-lock.json
	sed -i 's/^version = ".*"/version = "$(PKG_VERSION)"/' clients/python/pyproject.toml
	sed -i '0,/^version = /s/^version = ".*"/version = "$(PKG_VERSION)"/' clients/rust/Cargo.toml
	sed -i '/^name = "idemproxy-worker"$$/{n;s/^version = ".*"/version = "$(PKG_VERSION)"/}' clients/rust/Cargo.lock
	sed -i -E 's/(idemproxy[-_]worker[-:])[0-9]+\.[0-9]+\.[0-9]+/\1$(PKG_VERSION)/g; /<artifactId>idemproxy-worker<\/artifactId>/{n;s|<version>[^<]*</version>|<version>$(PKG_VERSION)</version>|}' \
	    clients/*/README.md
	sed -i -E 's/(libidemproxy_client\.so\.)[0-9]+\.[0-9]+\.[0-9]+/\1$(PKG_VERSION)/g' clients/c/README.md

demo: deps all
	./demo/run.sh

# The inbox and fence in PostgreSQL, with a Python worker (docs/database.md).
demo-db: deps all
	$(MAKE) -s -C clients/python
	./demo/db.sh

# The two container images (deploy/docker; BuildKit). The image has no .git: the
# commit and the version go in as build arguments, for `idemproxy version`,
# build_info{commit} and the org.opencontainers.image.* labels. REGISTRY=host/path/
# prefixes the names; DOCKER=podman works too.
DOCKER   ?= docker
REGISTRY ?=
images:
	$(DOCKER) build --build-arg COMMIT=$(COMMIT) --build-arg VERSION=$(PKG_VERSION) \
	  -f deploy/docker/Dockerfile -t $(REGISTRY)idemproxy:$(PKG_VERSION) .
	$(DOCKER) build --build-arg COMMIT=$(COMMIT) --build-arg VERSION=$(PKG_VERSION) \
	  -f deploy/docker/Dockerfile.worker -t $(REGISTRY)idemproxy-example-worker:$(PKG_VERSION) .

clean:
	rm -rf $(B)
	$(MAKE) -C clients/c clean

-include $(wildcard $(B)/proxy/*.d $(B)/tests/*.d)
