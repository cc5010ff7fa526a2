# In-tree plugins: each builds to plugins/NAME/nbdkit-NAME-plugin.so and loads
# in blkd and in nbdkit alike.
PLUGIN_NAMES = ram rawio
# A plugin with its own make fragment (plugins/NAME/NAME.mk) adds itself
# to PLUGIN_NAMES, its packages to DEPS and its libraries to
# PLUGIN_LIBS_NAME (the link line's tail).
include $(wildcard plugins/*/*.mk)
PLUGINS = $(foreach p,$(PLUGIN_NAMES),plugins/$(p)/nbdkit-$(p)-plugin.so)
# Test-only plugins: built by `all` (the tests load them from the tree) but
# kept out of PLUGINS, which is what `install` copies.  The top-level
# `clean` removes only $(PLUGINS); the *.so rule in .gitignore keeps these
# out of git, and `make clean-test-plugins` removes them.
PLUGIN_TEST_NAMES = partial
PLUGIN_TESTS = $(foreach p,$(PLUGIN_TEST_NAMES),plugins/$(p)/nbdkit-$(p)-plugin.so)

# No sanitizer flags: the same .so must load into a plain nbdkit too.  The
# objects live in build/plugins whatever the flavour for the same reason.
PLUGIN_ALL_CFLAGS = $(BLKD_CPPFLAGS) $(CPPFLAGS) $(BLKD_CFLAGS) -fPIC $(CFLAGS)
PLUGIN_BUILD = build/plugins

all: $(PLUGINS) $(PLUGIN_TESTS)

.PHONY: clean-test-plugins
clean-test-plugins:
	rm -f $(PLUGIN_TESTS)

# One link rule per plugin over its own objects only: touching ram.c
# rebuilds the ram plugin, nothing else.
define plugin_rule
plugins/$(1)/nbdkit-$(1)-plugin.so: $(patsubst %.c,$(PLUGIN_BUILD)/%.o,$(wildcard plugins/$(1)/*.c))
	$$(CC) $$(PLUGIN_ALL_CFLAGS) -shared -o $$@ $$^ -pthread $$(LDFLAGS) $$(PLUGIN_LIBS_$(1))
endef
$(foreach p,$(PLUGIN_NAMES) $(PLUGIN_TEST_NAMES),$(eval $(call plugin_rule,$(p))))

$(PLUGIN_BUILD)/%.o: %.c | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_ALL_CFLAGS) -c -o $@ $<

-include $(patsubst %.c,$(PLUGIN_BUILD)/%.d,$(wildcard plugins/*/*.c))
