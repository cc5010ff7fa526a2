#!/usr/bin/env bash
# The rbd error checks with the plugin hosted by nbdkit.
PLUGIN_HOST=nbdkit exec "$(dirname "$0")/test-rbd-errors.sh"
