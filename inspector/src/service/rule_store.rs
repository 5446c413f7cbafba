//! Introspection rules in the store (`rules/<uuid>`), in creation order.

use paddock_store::{Compare, Op, Txn};
use serde_json::{Value, json};
use uuid::Uuid;

use super::{ErrorKind, Inspector, InspectorError, Result};
use crate::rules::{self, Rule};

pub const RULES: &str = "rules/";

impl Inspector {
    /// Every rule, in creation order (the store's, so rules created in the same second, as
    /// a rules file imports them, keep their order), which is the order they apply in.
    pub async fn rules(&self) -> Result<Vec<Rule>> {
        let mut kvs = self.store.range(RULES).await?;
        kvs.sort_by_key(|kv| kv.create_revision);
        kvs.iter()
            .map(|kv| {
                serde_json::from_slice(&kv.value).map_err(|e| {
                    InspectorError::of(
                        ErrorKind::Store,
                        format!("rule {} is unreadable: {e}", kv.key),
                    )
                })
            })
            .collect()
    }

    pub async fn rule(&self, uuid: &str) -> Result<Rule> {
        let kv = self
            .store
            .get(&format!("{RULES}{uuid}"))
            .await?
            .ok_or_else(|| {
                InspectorError::of(ErrorKind::NotFound, format!("Rule {uuid} was not found"))
            })?;
        serde_json::from_slice(&kv.value)
            .map_err(|e| InspectorError::of(ErrorKind::Store, e.to_string()))
    }

    pub async fn create_rule(&self, body: &Value, now: i64) -> Result<Rule> {
        rules::validate(body).map_err(|e| InspectorError::invalid(e.to_string()))?;
        // An empty UUID is none (`if body.get('uuid')`).
        let uuid = match body
            .get("uuid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
        {
            Some(u) => Uuid::parse_str(u)
                .map_err(|_| InspectorError::invalid(format!("Invalid UUID value {u}")))?,
            None => Uuid::new_v4(),
        };
        let fill = |c: &Value| {
            let mut c = c.clone();
            if let Value::Object(m) = &mut c {
                m.entry("invert").or_insert(json!(false));
                m.entry("multiple").or_insert(json!("any"));
            }
            c
        };
        let rule = Rule {
            uuid,
            description: body
                .get("description")
                .and_then(Value::as_str)
                .map(String::from),
            scope: body.get("scope").and_then(Value::as_str).map(String::from),
            conditions: body
                .get("conditions")
                .and_then(Value::as_array)
                .map(|c| c.iter().map(fill).collect())
                .unwrap_or_default(),
            actions: body["actions"].as_array().cloned().unwrap_or_default(),
            created_at: now,
        };
        let created = self
            .store
            .create(
                &format!("{RULES}{uuid}"),
                serde_json::to_vec(&rule).unwrap_or_default(),
            )
            .await?;
        if !created {
            return Err(InspectorError::conflict(format!(
                "Rule with UUID {uuid} already exists"
            )));
        }
        Ok(rule)
    }

    pub async fn delete_rule(&self, uuid: &str) -> Result<()> {
        let txn = Txn {
            compare: vec![Compare::ModRevision {
                key: format!("{RULES}{uuid}"),
                revision: 0,
            }],
            success: vec![],
            failure: vec![Op::delete(format!("{RULES}{uuid}"))],
        };
        if self.store.txn(txn).await?.succeeded {
            return Err(InspectorError::of(
                ErrorKind::NotFound,
                format!("Rule {uuid} was not found"),
            ));
        }
        Ok(())
    }

    pub async fn delete_rules(&self) -> Result<()> {
        self.store
            .txn(Txn {
                success: vec![Op::DeletePrefix {
                    prefix: RULES.into(),
                }],
                ..Txn::default()
            })
            .await?;
        Ok(())
    }
}
