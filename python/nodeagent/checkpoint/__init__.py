"""Named checkpoints: small files a component writes atomically and reads back after a restart.

`CheckpointStore(directory)` (the agent uses ``<state_dir>/checkpoints``) keeps one file per
name; names follow the kubelet checkpoint key rule (characters of ``[A-Za-z0-9-_.]``, letter or
digit at both ends) but with at most 200 characters (not 250: the name of a file moved aside
must fit Linux's 255 bytes) and must not contain ``.corrupt-``. `write(name, data)` replaces
a checkpoint atomically: a dot-file in the same directory is written and fsynced, renamed over
the old file, and the directory is fsynced, so a crash at any point leaves the old or the new
checkpoint (a killed writer's leftover dot-file is removed by the next store's first operation).
`read(name)` has three outcomes (`CheckpointRead.state`): FOUND with the data, NOT_FOUND, or
CORRUPT. A corrupt file is never overwritten silently nor crashed on: it is renamed to
``<name>.corrupt-<UTC time>`` (the newest three are kept per name), logged with the reason and
counted in ``nodeagent_checkpoint_corrupt_total{name}``; failed writes are logged, counted in
``nodeagent_checkpoint_write_failures_total{name}`` and raised (the old checkpoint is kept).

The file format (version 1) is ours: one ASCII header line, then the payload bytes unchanged::

    nodeagent-checkpoint 1 sha256=<64 lowercase hex digits> length=<decimal>\\n<payload>

The header is parsed strictly, so every truncation and every single-byte change of a file is
detected. The kubelet and Katalyst write JSON ``{"Data": ..., "Checksum": N}`` whose checksum is
an FNV-32a hash of a go-spew dump of Go values, which Python cannot reproduce: such a file (for
example Katalyst's ``reporter_manager_checkpoint`` copied into our directory) reads as CORRUPT,
is moved aside, and the component starts fresh, as Katalyst itself does on a corrupt checkpoint.
"""

from nodeagent.checkpoint.store import CheckpointRead, CheckpointState, CheckpointStore

__all__ = ["CheckpointRead", "CheckpointState", "CheckpointStore"]
