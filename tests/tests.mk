# Tests: unit binaries (tests/unit-*.c) and scripts (tests/test-*.sh|py).
TEST_SRCS = $(wildcard tests/unit-*.c)
TEST_BINS = $(TEST_SRCS:%.c=%)
# Unit tests link the server objects they test, minus main.
UNIT_OBJS = $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJS))

tests/unit-%: tests/unit-%.c $(UNIT_OBJS)
	$(CC) $(CFLAGS) -rdynamic -o $@ $< $(UNIT_OBJS) $(LDFLAGS) $(SERVER_LIBS)

check: deps all $(TEST_BINS)
	@tests/run.sh $(TESTS)

# Test-only plugins (tests/plugins/NAME.c): built for the suite, never
# installed.
TEST_PLUGIN_SRCS = $(wildcard tests/plugins/*.c)
TEST_PLUGINS = $(patsubst tests/plugins/%.c,tests/plugins/nbdkit-%-plugin.so,$(TEST_PLUGIN_SRCS))
tests/plugins/nbdkit-%-plugin.so: tests/plugins/%.c
	$(CC) -std=gnu11 $(WARN) -O2 -g -D_GNU_SOURCE -fPIC -shared -pthread -o $@ $<
check: $(TEST_PLUGINS)

# Test-only filters (tests/filters/NAME.c), likewise.
TEST_FILTER_SRCS = $(wildcard tests/filters/*.c)
TEST_FILTERS = $(patsubst tests/filters/%.c,tests/filters/nbdkit-%-filter.so,$(TEST_FILTER_SRCS))
tests/filters/nbdkit-%-filter.so: tests/filters/%.c
	$(CC) -std=gnu11 $(WARN) -O2 -g -D_GNU_SOURCE -fPIC -shared -pthread -o $@ $<
check: $(TEST_FILTERS)

# Test-only clients (tests/helpers/*.c).
TEST_HELPER_SRCS = $(wildcard tests/helpers/*.c)
TEST_HELPERS = $(TEST_HELPER_SRCS:%.c=%)
tests/helpers/%: tests/helpers/%.c
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -lssl -lcrypto
check: $(TEST_HELPERS)
