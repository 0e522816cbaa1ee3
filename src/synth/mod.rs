//! Writes random-weight checkpoints in the exact published `fishaudio/drama-3` layout.
