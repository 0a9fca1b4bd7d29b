//! The per-node state of the modes sharing one TCP endpoint
//! ([`ModeStates`]).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The per-node state of the modes on one TCP endpoint, by type: each
/// mode keeps its own (torchestra its switching flag and counter) without
/// the endpoint knowing what it is.
#[derive(Default)]
pub(crate) struct ModeStates(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl ModeStates {
    /// The node's state of type `T`, made with its default the first time.
    pub(crate) fn get<T: Any + Default + Send + Sync>(&self) -> Arc<T> {
        let mut states = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let state = states
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()))
            .clone();
        drop(states);
        state
            .downcast::<T>()
            .unwrap_or_else(|_| unreachable!("the map holds each type under its own id"))
    }
}
