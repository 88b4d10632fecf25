# sbx build. Every library through pkg-config; warnings are errors.
#   make            build/sbx, build/libsbx.{a,so}, build/sbx.so (module for lua5.4)
#   make test       the whole suite against the real dockerd (README's command)
#   make test-unit  the files that need nothing but the build (no Docker, no
#                   root, no local boxes): each test file's "needs:" line
#   make check      the suite again under ASan+UBSan
#   make test-podman  the suite against Podman's Docker-compatible API
#   make install PREFIX=/usr/local [DESTDIR=...]
#                   binary, libraries, header, sbx.pc, man page, Lua module
#   make module / install-module LUA_CMOD=DIR
#                   only sbx.so, for sbx-<version>-1.rockspec (luarocks make)
PKGS      := lua5.4 libcurl libcjson libuv openssl libwebsockets libarchive libseccomp
PREFIX    ?= /usr/local
BUILD     ?= build
CC        ?= cc
LUA       ?= lua5.4
MANDIR    ?= $(PREFIX)/share/man
LUA_CMOD  ?= $(PREFIX)/lib/lua/5.4
VERSION   := $(shell sed -n 's/^\#define SBX_VERSION "\(.*\)"/\1/p' src/sbx.h)

# The git commit the build comes from, with "-dirty" when tracked files
# differ from it; "unknown" outside a git checkout (a tarball builds too).
COMMIT    := $(shell test -e .git && git rev-parse --short HEAD 2>/dev/null || echo unknown)
ifneq ($(COMMIT),unknown)
ifneq ($(shell git status --porcelain --untracked-files=no 2>/dev/null),)
COMMIT    := $(COMMIT)-dirty
endif
endif

ifneq ($(shell pkg-config --exists $(PKGS) && echo yes),yes)
$(error missing libraries: run scripts/setup.sh (pkg-config $(PKGS)))
endif

WARN      := -Wall -Wextra -Werror -Wshadow -Wundef -Wwrite-strings \
             -Wstrict-prototypes -Wmissing-prototypes -Wformat=2
CFLAGS    ?= -O2 -g
CFLAGS    += -std=gnu11 -fPIC $(WARN) $(shell pkg-config --cflags $(PKGS))
LIBS      := $(shell pkg-config --libs libcurl libcjson libuv openssl libwebsockets libarchive libseccomp)
LUALIB    := $(shell pkg-config --libs lua5.4)
ifeq ($(SANITIZE),1)
CFLAGS    += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS   += -fsanitize=address,undefined
endif

LIB_SRCS  := src/host.c src/core.c src/fail.c src/http.c src/json.c src/stream.c src/text.c \
             src/capture.c src/embed.c src/sigv4.c src/ssm.c src/lines.c src/ws.c \
             src/demux.c src/hijack.c src/proc.c src/agent_proto.c src/sha256.c \
             src/agent_lua.c src/layer.c src/layer_lua.c src/sandbox.c src/pty_escape.c \
             src/tar.c src/tar_lua.c src/deadline.c src/pattern.c src/random.c
LUA_SRCS  := $(shell find lua/sbx -name '*.lua' | sort)
# sbx-agent (agent/): a static program per architecture, carried inside
# libsbx (agent_blob.S) so sbx can place it into any box. x86_64 with musl
# when musl-gcc is there (small), else the system compiler statically;
# aarch64 with Debian's cross compiler when it is installed.
AGENT_SRCS  := agent/sbx_agent.c src/agent_proto.c src/sha256.c src/pty_escape.c
AGENT_HDRS  := src/agent_proto.h src/sha256.h src/pty_escape.h
AGENT_CC    ?= $(shell command -v musl-gcc >/dev/null 2>&1 && echo musl-gcc || echo $(CC))
AGENT_CROSS ?= aarch64-linux-gnu-
AGENT_FLAGS := -static -O2 -std=gnu11 $(WARN) -Isrc
AGENT_ARCHES := x86_64 $(shell command -v $(AGENT_CROSS)gcc >/dev/null 2>&1 && echo aarch64)
# sbx-launch (src/sbx_launch.c): the static program that starts a local
# box (user and mount namespaces, the writable layer, then bubblewrap). It
# runs on the host, so it is built for the host only, like the agent for
# x86_64, and carried in the same blob.
# Fuzz targets: fuzz/fuzz_<name>.c, and the codecs (src/<dep>.c) each links.
FUZZ_NAMES          := demux http_head utf8 ssm sigv4 agent layer pty_escape tar
FUZZ_DEPS_demux     := demux
FUZZ_DEPS_http_head := hijack demux
FUZZ_DEPS_utf8      := capture
FUZZ_DEPS_ssm       := ssm
FUZZ_DEPS_sigv4     := sigv4
FUZZ_DEPS_agent     := agent_proto sha256
FUZZ_DEPS_layer     := layer
FUZZ_DEPS_pty_escape := pty_escape
FUZZ_DEPS_tar       := tar
LIB_OBJS  := $(LIB_SRCS:src/%.c=$(BUILD)/%.o) $(BUILD)/lua_blob.o $(BUILD)/agent_blob.o

all: $(BUILD)/sbx $(BUILD)/libsbx.a $(BUILD)/libsbx.so $(BUILD)/sbx.so \
     $(BUILD)/unit_capture $(BUILD)/unit_sigv4 $(BUILD)/unit_ssm $(BUILD)/unit_pty_escape $(BUILD)/embed_test \
     $(FUZZ_NAMES:%=$(BUILD)/replay_%)

$(BUILD)/%.o: src/%.c | $(BUILD)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# core.commit: host.o embeds the commit, and $(BUILD)/commit changes (so
# host.o is rebuilt) exactly when the commit does.
$(BUILD)/core.o: $(BUILD)/commit
$(BUILD)/core.o: CFLAGS += -DSBX_COMMIT='"$(COMMIT)"'
$(BUILD)/commit: FORCE | $(BUILD)
	@echo '$(COMMIT)' | cmp -s - $@ || echo '$(COMMIT)' > $@

$(BUILD)/lua_blob.c: scripts/embed.lua $(LUA_SRCS) | $(BUILD)
	$(LUA) scripts/embed.lua $@ $(LUA_SRCS)

$(BUILD)/lua_blob.o: $(BUILD)/lua_blob.c
	$(CC) $(filter-out -W%,$(CFLAGS)) -c $< -o $@

$(BUILD)/sbx-agent-x86_64: $(AGENT_SRCS) $(AGENT_HDRS) | $(BUILD)
	$(AGENT_CC) $(AGENT_FLAGS) -o $@ $(AGENT_SRCS) && strip $@

$(BUILD)/sbx-launch: src/sbx_launch.c | $(BUILD)
	$(AGENT_CC) $(AGENT_FLAGS) -o $@ src/sbx_launch.c && strip $@

$(BUILD)/sbx-agent-aarch64: $(AGENT_SRCS) $(AGENT_HDRS) | $(BUILD)
	$(AGENT_CROSS)gcc $(AGENT_FLAGS) -o $@ $(AGENT_SRCS) && $(AGENT_CROSS)strip $@

# The agents as symbols sbx_agent_<arch> / sbx_agent_<arch>_end, and
# sbx-launch as sbx_launch / sbx_launch_end.
$(BUILD)/agent_blob.S: $(AGENT_ARCHES:%=$(BUILD)/sbx-agent-%) $(BUILD)/sbx-launch | $(BUILD)
	{ echo '/* generated by the Makefile; do not edit */'; \
	  echo '.section .rodata'; \
	  for a in $(AGENT_ARCHES); do \
	    echo ".global sbx_agent_$$a, sbx_agent_$${a}_end"; \
	    echo ".balign 16"; \
	    echo "sbx_agent_$$a: .incbin \"$(BUILD)/sbx-agent-$$a\""; \
	    echo "sbx_agent_$${a}_end:"; \
	  done; \
	  echo ".global sbx_launch, sbx_launch_end"; \
	  echo ".balign 16"; \
	  echo "sbx_launch: .incbin \"$(BUILD)/sbx-launch\""; \
	  echo "sbx_launch_end:"; \
	  echo '.section .note.GNU-stack,"",@progbits'; } > $@

$(BUILD)/agent_blob.o: $(BUILD)/agent_blob.S
	$(CC) -c $< -o $@

$(BUILD)/agent_lua.o: CFLAGS += $(AGENT_ARCHES:%=-DSBX_AGENT_%)
$(BUILD)/agent_lua.o: $(BUILD)/agent_blob.S
$(BUILD)/sandbox.o: CFLAGS += -DSBX_LAUNCHER

$(BUILD)/libsbx.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libsbx.so: $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LIBS) $(LUALIB)

# The module for a stock lua5.4: the interpreter provides the Lua symbols.
$(BUILD)/sbx.so: $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/sbx: $(BUILD)/main.o $(BUILD)/init.o $(BUILD)/libsbx.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(LUALIB) -lm

$(BUILD)/unit_capture: tests/unit_capture.c $(BUILD)/capture.o
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $^

$(BUILD)/unit_sigv4: tests/unit_sigv4.c $(BUILD)/sigv4.o
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $^ $(LIBS) $(LUALIB)

$(BUILD)/unit_ssm: tests/unit_ssm.c $(BUILD)/ssm.o
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $^ $(LIBS) $(LUALIB)

$(BUILD)/unit_pty_escape: tests/unit_pty_escape.c $(BUILD)/pty_escape.o
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $^

$(BUILD)/embed_test: tests/embed_test.c $(BUILD)/libsbx.a
	$(CC) $(CFLAGS) -Isrc $(LDFLAGS) -o $@ $^ $(LIBS) $(LUALIB) -lm

$(BUILD):
	mkdir -p $@

# Fuzzing. replay_<name> (built by all) runs a target over its checked-in
# corpus with the normal compiler; make test runs it. make fuzz builds each
# target with clang's libFuzzer, ASan and UBSan in $(FUZZ_BUILD) and runs it
# FUZZ_SECONDS against fuzz/corpus/<name>, failing on any finding; new
# inputs land in $(FUZZ_BUILD)/new/<name>, and make fuzz-merge minimises them
# into the corpus.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := -O1 -g -std=gnu11 $(WARN) $(shell pkg-config --cflags $(PKGS)) \
                -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
                -fsanitize=fuzzer-no-link,address,undefined

define FUZZ_RULES
$(BUILD)/replay_$(1): fuzz/replay.c fuzz/fuzz_$(1).c fuzz/fuzz.h $(FUZZ_DEPS_$(1):%=$(BUILD)/%.o)
	$$(CC) $$(CFLAGS) -Isrc -Ifuzz $$(LDFLAGS) -o $$@ $$(filter %.c %.o,$$^) $$(LIBS) $$(LUALIB)
$(FUZZ_BUILD)/fuzz_$(1): fuzz/fuzz_$(1).c fuzz/fuzz.h $(FUZZ_DEPS_$(1):%=$(FUZZ_BUILD)/%.o)
	$$(FUZZ_CC) $$(FUZZ_CFLAGS) -fsanitize=fuzzer -Isrc -Ifuzz -o $$@ $$(filter %.c %.o,$$^) $$(LIBS) $$(LUALIB)
endef
$(foreach t,$(FUZZ_NAMES),$(eval $(call FUZZ_RULES,$(t))))

$(FUZZ_BUILD)/%.o: src/%.c | $(FUZZ_BUILD)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_BUILD):
	mkdir -p $@

fuzz: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
	fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_NAMES)

fuzz-merge: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
	fuzz/run.sh --merge $(FUZZ_BUILD) 0 $(FUZZ_NAMES)

clean: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)

.PHONY: fuzz fuzz-merge clean-fuzz
-include $(wildcard $(FUZZ_BUILD)/*.d)

test: all
	tests/run.sh $(BUILD)

# What a laptop without Docker or root can run (tests/run.sh reads each
# file's "needs:" line).
test-unit: all
	SBX_TEST_UNIT=1 tests/run.sh $(BUILD)

# The same suite against Podman's Docker-compatible service.
test-podman: all
	scripts/podman.sh $(BUILD)

# ASan's quarantine keeps freed blocks resident; a small one keeps the
# memory-bound tests meaningful while still catching use-after-free.
check:
	ASAN_OPTIONS=quarantine_size_mb=16:detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1 SBX_SANITIZED=1 $(MAKE) BUILD=build-asan SANITIZE=1 test

# sbx.pc names the prefix the files will live under (not DESTDIR).
install: all install-module
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(MANDIR)/man1
	install -m 755 $(BUILD)/sbx $(DESTDIR)$(PREFIX)/bin/sbx
	install -m 644 $(BUILD)/libsbx.a $(DESTDIR)$(PREFIX)/lib/libsbx.a
	install -m 755 $(BUILD)/libsbx.so $(DESTDIR)$(PREFIX)/lib/libsbx.so
	install -m 644 src/sbx.h $(DESTDIR)$(PREFIX)/include/sbx.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' sbx.pc.in > $(BUILD)/sbx.pc
	install -m 644 $(BUILD)/sbx.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/sbx.pc
	sed -e 's|@VERSION@|$(VERSION)|g' docs/sbx.1.in > $(BUILD)/sbx.1
	install -m 644 $(BUILD)/sbx.1 $(DESTDIR)$(MANDIR)/man1/sbx.1

# The Lua module alone. luarocks builds with its own CFLAGS appended
# (ROCK_CFLAGS, see the rockspec) and installs with LUA_CMOD=its LIBDIR.
CFLAGS    += $(ROCK_CFLAGS)
module: $(BUILD)/sbx.so

install-module: module
	install -d $(DESTDIR)$(LUA_CMOD)
	install -m 755 $(BUILD)/sbx.so $(DESTDIR)$(LUA_CMOD)/sbx.so

clean:
	rm -rf build build-asan

FORCE:

.PHONY: all test test-unit test-podman check install module install-module clean FORCE
-include $(wildcard $(BUILD)/*.d)
