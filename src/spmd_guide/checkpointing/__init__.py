"""Part XI, a run you can stop and move (book/checkpointing/).

- `checkpoint`: save, restore and latest_step with Orbax: a pytree of sharded arrays written
  as it lies, read back in any layout (checkpointing/saving, checkpointing/resuming).
- `names`: how Orbax names each leaf (keys joined with dots), the refusal of trees whose
  leaves would share a name, and what it stores for a typed PRNG key.
- `anatomy`: who writes which piece, the files of a step, what a restore in another layout
  reads, and whether a layout fits a chip's memory (checkpointing/saving,
  checkpointing/resuming).
- `crash`: a process killed with SIGKILL while it saves (checkpointing/saving).
- `training`: train_lm, the Part IX transformer trained with AdamW on its counting task,
  saving parameters, optimizer state and data position, and resuming under another strategy
  and device count (checkpointing/resuming).

The chapters import the modules themselves.
"""
