# blkperf: the netperf-style NBD benchmark client, on libnbd.
all: blkperf
blkperf: $(wildcard client/*.c) $(wildcard client/*.h)
	$(CC) $(CFLAGS) -o $@ $(wildcard client/*.c) $(LDFLAGS) -lnbd -lm
