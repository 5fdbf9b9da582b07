"""nanoloop's library: the support modules the root scripts import (dev/README.md has the table)."""
