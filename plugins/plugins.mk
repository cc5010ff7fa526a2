# In-tree plugins: each builds to plugins/NAME/nbdkit-NAME-plugin.so and loads
# in blkd and in nbdkit alike.
PLUGIN_NAMES = ram rawio
PLUGINS = $(foreach p,$(PLUGIN_NAMES),plugins/$(p)/nbdkit-$(p)-plugin.so)
# Test-only plugins: built by `all` (the tests load them from the tree) but
# kept out of PLUGINS, which is what `install` copies.  The top-level
# `clean` removes only $(PLUGINS); the *.so rule in .gitignore keeps these
# out of git, and `make clean-test-plugins` removes them.
PLUGIN_TEST_NAMES = partial
PLUGIN_TESTS = $(foreach p,$(PLUGIN_TEST_NAMES),plugins/$(p)/nbdkit-$(p)-plugin.so)
PLUGIN_CFLAGS = -std=gnu11 $(WARN) -O2 -g -D_GNU_SOURCE -Iinclude -fPIC -pthread

all: $(PLUGINS) $(PLUGIN_TESTS)

.PHONY: clean-test-plugins
clean-test-plugins:
	rm -f $(PLUGIN_TESTS)

plugins/%.so: $(wildcard plugins/*/*.c) $(wildcard plugins/*/*.h)
	$(CC) $(PLUGIN_CFLAGS) -shared -o $@ $(wildcard $(dir $@)*.c) -pthread
