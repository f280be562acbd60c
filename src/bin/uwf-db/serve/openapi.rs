//! The OpenAPI 3.1 document, made from the route table and the contract's
//! schemas: 3.1's schema dialect is JSON Schema 2020-12, which is what the
//! `api` types' schemas are; here their definitions live under
//! `#/components/schemas/`.

use std::sync::OnceLock;

use axum::Json;
use axum::extract::RawQuery;
use schemars::generate::{Contract, SchemaSettings};
use serde_json::{Map, Value, json};
use uwf_db::api;

use super::error::ApiResult;
use super::params::Params;
use super::routes::{Answer, In, ROUTES};

/// The document (made once).
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

pub async fn serve(RawQuery(q): RawQuery) -> ApiResult<Json<Value>> {
    Params::parse(q.as_deref(), &[], &[])?;
    Ok(Json(document().clone()))
}

fn generator(contract: Contract) -> schemars::SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.contract = contract;
    settings.into_generator()
}

fn build() -> Value {
    // Answers as they are serialized; request bodies as they are read
    // (a defaulted field is optional there).
    let mut answers = generator(Contract::Serialize);
    let mut requests = generator(Contract::Deserialize);
    let error = answers.subschema_for::<api::ErrorAnswer>();
    let error_response = json!({
        "description": "An error: its kind says what a client can do (SPEC §12)",
        "content": {"application/json": {"schema": error}},
    });
    let mut paths: Map<String, Value> = Map::new();
    for r in ROUTES {
        let parameters: Vec<Value> = r
            .params
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "in": if p.place == In::Path { "path" } else { "query" },
                    "required": p.required,
                    "description": p.description,
                    "schema": serde_json::from_str::<Value>(p.schema).unwrap_or(Value::Bool(true)),
                })
            })
            .collect();
        let mut responses = Map::new();
        match &r.answer {
            Answer::Json(status, schema) => {
                responses.insert(
                    status.to_string(),
                    json!({"description": "OK", "content": {"application/json": {"schema": schema(&mut answers)}}}),
                );
            }
            Answer::Events => {
                responses.insert(
                    "200".into(),
                    json!({"description": "An event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}),
                );
            }
            Answer::OpenApi => {
                responses.insert(
                    "200".into(),
                    json!({"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}),
                );
            }
        }
        responses.insert("default".into(), error_response.clone());
        let mut op = json!({
            "operationId": r.operation,
            "summary": r.summary,
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(body) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": {"application/json": {"schema": body(&mut requests)}},
            });
        }
        let entry = paths
            .entry(r.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.method] = op;
    }
    let mut schemas = answers.take_definitions(true);
    for (name, schema) in requests.take_definitions(true) {
        schemas.entry(name).or_insert(schema);
    }
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "uwf-db",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "The uwf-db HTTP API (JSON contract version {}): threads, their steps, workflows and usage, live events, and the writes that start, resume, stop, cancel, fork and label threads. With --token, send Authorization: Bearer TOKEN.",
                api::API_VERSION
            ),
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"token": []}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_resolves_and_every_route_is_described() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = part.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "unresolved $ref {name}");
        }
        for r in ROUTES {
            let op = &doc["paths"][r.path][r.method];
            assert_eq!(op["operationId"], r.operation, "{} {}", r.method, r.path);
            for p in r.params.iter().filter(|p| p.place == In::Path) {
                assert!(r.path.contains(&format!("{{{}}}", p.name)));
            }
        }
        assert!(
            !text.contains("#/$defs/"),
            "a reference escaped the components"
        );
    }
}
