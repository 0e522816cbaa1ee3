//! `GET /v1/models` in OpenAI's list shape: `{"object": "list", "data": [{"id", "object": "model",
//! "created", "owned_by"}]}`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds; OpenAI's SDK types it as an integer.
    pub created: u64,
    pub owned_by: String,
}

impl ModelList {
    /// The list for the given model ids, in order, all created at `created`.
    pub fn new<'a>(ids: impl IntoIterator<Item = &'a str>, created: u64, owned_by: &str) -> ModelList {
        let data = ids
            .into_iter()
            .map(|id| ModelCard {
                id: id.to_owned(),
                object: "model".to_owned(),
                created,
                owned_by: owned_by.to_owned(),
            })
            .collect();
        ModelList { object: "list".to_owned(), data }
    }
}
