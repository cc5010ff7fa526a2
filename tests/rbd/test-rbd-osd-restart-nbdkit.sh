#!/usr/bin/env bash
# The OSD restart checks with the plugin hosted by nbdkit.
# run.sh: serial
PLUGIN_HOST=nbdkit exec "$(dirname "$0")/test-rbd-osd-restart.sh"
