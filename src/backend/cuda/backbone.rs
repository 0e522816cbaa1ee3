//! `BackboneOps` on the GPU (being written).
