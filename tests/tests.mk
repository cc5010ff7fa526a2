# Tests: unit binaries (tests/unit-*.c) and scripts (tests/test-*.sh|py).
# `make -jN check` runs N tests at a time (tests/run.sh reads the job count
# from MAKEFLAGS); TESTS=... names a subset.
TEST_SRCS = $(wildcard tests/unit-*.c)
TEST_BINS = $(TEST_SRCS:%.c=%)
# Unit tests link the server objects they test, minus main.
UNIT_OBJS = $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJS))

tests/unit-%: $(BUILD)/tests/unit-%.o $(UNIT_OBJS) $(BUILD)/.flavour
	$(CC) $(ALL_CFLAGS) -rdynamic -o $@ $< $(UNIT_OBJS) $(ALL_LDFLAGS) $(SERVER_LIBS)
-include $(TEST_SRCS:%.c=$(BUILD)/%.d)

# Test-only plugins (tests/plugins/NAME.c): built for the suite, never
# installed; like the in-tree plugins, without sanitizers.
TEST_PLUGIN_SRCS = $(wildcard tests/plugins/*.c)
TEST_PLUGINS = $(patsubst tests/plugins/%.c,tests/plugins/nbdkit-%-plugin.so,$(TEST_PLUGIN_SRCS))
tests/plugins/nbdkit-%-plugin.so: $(PLUGIN_BUILD)/tests/plugins/%.o
	$(CC) $(PLUGIN_ALL_CFLAGS) -shared -o $@ $< -pthread $(LDFLAGS)
-include $(TEST_PLUGIN_SRCS:%.c=$(PLUGIN_BUILD)/%.d)

# Test-only filters (tests/filters/NAME.c), likewise.
TEST_FILTER_SRCS = $(wildcard tests/filters/*.c)
TEST_FILTERS = $(patsubst tests/filters/%.c,tests/filters/nbdkit-%-filter.so,$(TEST_FILTER_SRCS))
tests/filters/nbdkit-%-filter.so: $(PLUGIN_BUILD)/tests/filters/%.o
	$(CC) $(PLUGIN_ALL_CFLAGS) -shared -o $@ $< -pthread $(LDFLAGS)
-include $(TEST_FILTER_SRCS:%.c=$(PLUGIN_BUILD)/%.d)

# Test-only clients (tests/helpers/*.c).
TEST_HELPER_SRCS = $(wildcard tests/helpers/*.c)
TEST_HELPERS = $(TEST_HELPER_SRCS:%.c=%)
tests/helpers/%: $(BUILD)/tests/helpers/%.o $(BUILD)/.flavour
	$(CC) $(ALL_CFLAGS) -o $@ $< $(ALL_LDFLAGS) $(SSL_LIBS)
-include $(TEST_HELPER_SRCS:%.c=$(BUILD)/%.d)

.PHONY: check-build
check-build: all $(TEST_BINS) $(TEST_PLUGINS) $(TEST_FILTERS) $(TEST_HELPERS)

# The runner reads make's job count from MAKEFLAGS, which make exports to
# recipes: -j2 here means two tests at a time.
check: $(DEPS_STEP) check-build
	@tests/run.sh $(TESTS)

# Pattern-made objects are intermediates; keep them so a second make
# rebuilds nothing.
.SECONDARY: $(TEST_SRCS:%.c=$(BUILD)/%.o) $(TEST_HELPER_SRCS:%.c=$(BUILD)/%.o) \
            $(TEST_PLUGIN_SRCS:%.c=$(PLUGIN_BUILD)/%.o) $(TEST_FILTER_SRCS:%.c=$(PLUGIN_BUILD)/%.o)
