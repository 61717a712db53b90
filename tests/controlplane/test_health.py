def test_healthz_checks_the_real_database_and_channel_layer(client, db, settings):
    response = client.get("/healthz")
    assert response.status_code == 200
    checks = response.json()["checks"]
    assert checks["database"]["vendor"] == (
        "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "sqlite"
    )
    expected_layer = "RedisChannelLayer" if settings.REDIS_URL else "InMemoryChannelLayer"
    assert checks["channel_layer"] == {**checks["channel_layer"], "ok": True, "backend": expected_layer}
