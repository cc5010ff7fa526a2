# Tests: unit binaries (tests/unit-*.c) and scripts (tests/test-*.sh|py).
TEST_SRCS = $(wildcard tests/unit-*.c)
TEST_BINS = $(TEST_SRCS:%.c=%)
# Unit tests link the server objects they test, minus main.
UNIT_OBJS = $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJS))

tests/unit-%: tests/unit-%.c $(UNIT_OBJS)
	$(CC) $(CFLAGS) -rdynamic -o $@ $< $(UNIT_OBJS) $(LDFLAGS) $(SERVER_LIBS)

check: deps all $(TEST_BINS)
	@tests/run.sh $(TESTS)
