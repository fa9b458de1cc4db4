# withruntime build. `make` builds build/; `make SAN=1` builds an ASan+UBSan
# tree in build-san/; `make check` runs the unit tests and fuzz-corpus replays.

CC ?= gcc
SAN ?= 0
PREFIX ?= /usr/local

ifeq ($(SAN),1)
BUILD := build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1 -g
else
BUILD := build
SANFLAGS :=
OPT := -O2 -g
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wformat=2 -Wvla \
        -Wmissing-prototypes -Wstrict-prototypes -Wno-format-nonliteral -Wno-format-truncation
CFLAGS_BASE := -std=c17 -D_GNU_SOURCE $(OPT) $(WARN) -Isrc -pthread -fstack-protector-strong
CFLAGS_ALL := $(CFLAGS_BASE) $(SANFLAGS) $(CFLAGS)
LIBS := -levent -levent_pthreads -levent_openssl -lssl -lcrypto -ljansson -lsqlite3 -lpthread $(shell pkg-config --libs libnftables)

COMMON_SRC := $(wildcard src/common/*.c) $(wildcard src/proto/*.c)
DAEMON_SRC := $(wildcard src/driver/*.c src/image/*.c src/store/*.c src/http/*.c src/net/*.c \
                src/api/*.c src/daemon/*.c src/cli/*.c)
LIB_SRC := $(COMMON_SRC) $(filter-out src/cli/main.c,$(DAEMON_SRC))
AGENT_SRC := $(wildcard src/agent/*.c)

# The dashboard's files (web/) go into the binary as data: an assembler file that .incbin's
# them (the C compiler's own assembler; no other tool).
WEB_FILES := $(wildcard web/*)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/src/api/web_assets.o
# The agent leaves out common/confine.c: it is for the daemon's children, and its getpwnam_r
# would tie the static agent to the host's NSS libraries (the linker warns).
AGENT_COMMON_SRC := $(filter-out src/common/confine.c,$(COMMON_SRC))
AGENT_OBJ := $(AGENT_SRC:%.c=$(BUILD)/agent-obj/%.o) $(AGENT_COMMON_SRC:%.c=$(BUILD)/agent-obj/%.o)

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/tests/%)

.PHONY: all check install clean format format-check docs

all: $(BUILD)/withruntime $(BUILD)/withruntime-agent

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/src/api/web_assets.o: src/api/web_assets.S $(WEB_FILES)
	@mkdir -p $(dir $@)
	$(CC) -c $< -o $@

# The agent is static and runs inside the sandbox; it is never built with sanitizers
# (their runtimes do not link statically) but gets the same warnings.
$(BUILD)/agent-obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -MMD -MP -c $< -o $@

# Made afresh each time: several objects share a base name (daemon/exec.o, cli/exec.o, ...),
# and `ar r` on an existing archive would replace the wrong member.
$(BUILD)/libwr.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/withruntime: $(BUILD)/src/cli/main.o $(BUILD)/libwr.a
	$(CC) $(CFLAGS_ALL) -o $@ $^ $(LIBS)

$(BUILD)/withruntime-agent: $(AGENT_OBJ)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -static -o $@ $^ -lpthread

$(BUILD)/tests/test_%: tests/unit/test_%.c $(wildcard tests/unit/*.h) $(BUILD)/libwr.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests/unit -o $@ $< $(BUILD)/libwr.a $(LIBS)

$(BUILD)/tests/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.c $(BUILD)/libwr.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< tests/fuzz/replay_main.c $(BUILD)/libwr.a $(LIBS)

check: all $(UNIT_BIN) $(FUZZ_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "# $$t"; $$t; done; \
	for f in $(FUZZ_BIN); do n=$${f##*/fuzz_}; echo "# $$f tests/fuzz/corpus/$$n"; \
	  $$f tests/fuzz/corpus/$$n; done

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/withruntime
	install -m 0755 $(BUILD)/withruntime $(DESTDIR)$(PREFIX)/bin/withruntime
	install -m 0755 $(BUILD)/withruntime-agent $(DESTDIR)$(PREFIX)/lib/withruntime/withruntime-agent

# docs/cli.md is made from the CLI's command table (tests/e2e/test_cli_cover.py checks it).
docs: $(BUILD)/withruntime
	$(BUILD)/withruntime help --markdown > docs/cli.md

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
