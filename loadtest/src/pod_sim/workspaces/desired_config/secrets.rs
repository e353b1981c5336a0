//! The env-var and files Secrets Rails appends (`devfile_resource_appender.rb`'s
//! `append_secret`), owned by the secrets inventory.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

use super::ANNOTATION_OWNING_INVENTORY;
use super::context::Context;

impl Context<'_> {
    /// `append_secret` with its data (`Base64.strict_encode64` of each value).
    pub(super) fn secret<'s>(
        &self,
        name: &str,
        data: impl Iterator<Item = (&'s str, &'s str)>,
    ) -> Value {
        let annotations = self.with(
            &self.common,
            ANNOTATION_OWNING_INVENTORY,
            &self.secrets_inventory,
        );
        let data: Map<String, Value> = data
            .map(|(k, v)| (k.to_owned(), Value::String(BASE64.encode(v))))
            .collect();
        json!({
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": self.metadata(name, &annotations),
            "data": data,
        })
    }
}
