"""The app ``pgdash serve`` runs, in process (Flask's test client), and its threads stopped."""


from dashboard.web.app import create_app


def open_app(url: str):
    app = create_app({"DB": url, "PUSH_INTERVAL": 60})
    return app, app.test_client()


def close_app(app) -> None:
    app.extensions["pgdash"].pusher.stop()
    app.extensions["pgdash"].store.close()
