"""Offline API docs: ``/docs`` renders Swagger UI from assets shipped in this package
(``common/static/swagger-ui``, vendored from the npm registry's swagger-ui-dist), never
from a CDN, so the page works on a machine without network access.

The OpenAPI document declares the bearer scheme (``components.securitySchemes.bearer``,
required by default; ``security: []`` on the public routes of the rule table), so Swagger
UI shows its Authorize button and sends the credential with "Try it out"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
SWAGGER = "/static/swagger-ui"


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` with local Swagger UI assets (create the app with docs_url=None)."""
    _declare_bearer(app)
    app.mount(SWAGGER, StaticFiles(directory=STATIC / "swagger-ui"), name="swagger-ui")
    title = f"{app.title} - API docs"

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=title,
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png")


BEARER = {"type": "http", "scheme": "bearer",
          "description": "a squall credential (`squall auth mint`; master routes, and the "
          "data nodes' front door and /metrics) or a payload token the master hands out "
          "(a data node's blob routes)"}


def _declare_bearer(app: FastAPI) -> None:
    """Wrap ``app.openapi`` so the document names the bearer scheme."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = BEARER
        doc["security"] = [{"bearer": []}]
        table = getattr(getattr(app.state, "access", None), "table", None)
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                if table is not None and isinstance(op, dict):
                    rule, _ = table.match(method.upper(), path)
                    if rule.public:
                        op["security"] = []
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
