# In-tree plugins: each builds to plugins/NAME/nbdkit-NAME-plugin.so and loads
# in blkd and in nbdkit alike.
PLUGIN_NAMES = ram rawio
PLUGINS = $(foreach p,$(PLUGIN_NAMES),plugins/$(p)/nbdkit-$(p)-plugin.so)
PLUGIN_CFLAGS = -std=gnu11 $(WARN) -O2 -g -D_GNU_SOURCE -Iinclude -fPIC -pthread

all: $(PLUGINS)

plugins/%.so: $(wildcard plugins/*/*.c) $(wildcard plugins/*/*.h)
	$(CC) $(PLUGIN_CFLAGS) -shared -o $@ $(wildcard $(dir $@)*.c) -pthread
