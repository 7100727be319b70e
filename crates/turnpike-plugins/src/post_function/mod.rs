//! post-function (Kong's serverless plugin, PRIORITY -1000): the operator's Lua code, run last
//! in each phase; the same handler as pre-function.

pub mod schema;

use std::sync::Arc;

use serde_json::Value;

use crate::pre_function::Serverless;
use crate::{Handler, PluginSpec};

pub struct PostFunction;

impl PluginSpec for PostFunction {
    fn name(&self) -> &'static str {
        "post-function"
    }
    fn priority(&self) -> i32 {
        -1000
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(self.name(), config)
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn build(&self, config: &Value, _: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        Ok(Arc::new(Serverless::new(self.name(), config)))
    }
}
