"""Offline API docs: ``/docs`` renders Swagger UI from assets shipped in this package
(``common/static/swagger-ui``, vendored from the npm registry's swagger-ui-dist), never
from a CDN, so the page works on a machine without network access."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
SWAGGER = "/static/swagger-ui"


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` with local Swagger UI assets (create the app with docs_url=None)."""
    app.mount(SWAGGER, StaticFiles(directory=STATIC / "swagger-ui"), name="swagger-ui")
    title = f"{app.title} - API docs"

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=title,
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png")
