# blkperf: the netperf-style NBD benchmark client, on libnbd.  Its objects
# share the server's object rule and tree ($(BUILD)/client, $(BUILD)/common).
BLKPERF_SRCS = $(wildcard client/*.c) $(wildcard common/*.c)
BLKPERF_OBJS = $(BLKPERF_SRCS:%.c=$(BUILD)/%.o)

all: blkperf
blkperf: $(BLKPERF_OBJS) $(BUILD)/.flavour
	$(CC) $(ALL_CFLAGS) -o $@ $(BLKPERF_OBJS) $(ALL_LDFLAGS) $(NBD_LIBS) -lm

-include $(BLKPERF_OBJS:.o=.d)
