import json


def test_the_openapi_schema_describes_the_api(client, db):
    response = client.get("/api/schema/", headers={"Accept": "application/vnd.oai.openapi+json"})
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["info"]["title"] == "Airlock API"
    assert "/api/v1/whoami" in schema["paths"]


def test_the_docs_page_loads_swagger_ui_from_our_own_static_files(client, db):
    page = client.get("/api/docs/").content.decode()
    assert "/static/vendor/swagger-ui/swagger-ui-bundle.js" in page
    assert "cdn" not in page.lower()
    assert client.get("/static/vendor/swagger-ui/swagger-ui-bundle.js").status_code == 200


def test_unknown_api_paths_answer_json(client, db):
    response = client.get("/api/v1/nothing")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_the_api_refuses_a_body_that_is_not_json_with_a_clear_error(acme, make_key, api):
    key = make_key(acme).key
    response = api(key).post("/api/v1/whoami", data="{", content_type="application/json")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


def test_the_schema_names_both_bearer_credentials_for_swagger_uis_authorize(client, db):
    schema = json.loads(client.get("/api/schema/", headers={"Accept": "application/vnd.oai.openapi+json"}).content)
    schemes = schema["components"]["securitySchemes"]
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "apiKey": ("http", "bearer"), "sessionToken": ("http", "bearer")}
    whoami = schema["paths"]["/api/v1/whoami"]["get"]
    assert {"apiKey": []} in whoami["security"]
    run = schema["paths"]["/api/v1/sessions/{session_id}/commands"]["post"]
    assert {"sessionToken": []} in run["security"] and {"apiKey": []} in run["security"]


def test_every_policy_endpoint_is_in_the_schema(client, db):
    schema = json.loads(client.get("/api/schema/", headers={"Accept": "application/vnd.oai.openapi+json"}).content)
    assert "post" in schema["paths"]["/api/v1/policies/{name}/versions/{number}/replay"]
    assert "get" in schema["paths"]["/api/v1/policy-schema"]
