"""Top-level URLs: pages, the REST API with its schema and docs, auth and admin."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from recipes.runs import views as recipes_views

from . import metrics, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("clusters/<slug:project>/<slug:name>/runs/", include("recipes.runs.urls")),
    path("clusters/<slug:project>/<slug:name>/tensorboard/", recipes_views.tensorboard_proxy, name="tensorboard"),
    path("clusters/<slug:project>/<slug:name>/tensorboard/<path:path>", recipes_views.tensorboard_proxy),
    path("clusters/", include("clusters.urls")),
    path("models/", include("recipes.registry.urls")),
    path("endpoints/", include("recipes.serving.urls")),
    path("api/v1/", include("clusters.api.urls")),
    path("api/v1/", include("recipes.api_urls")),
    path("v1beta1/", include("clusters.api.compat_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("accounts/login/", views.SignInView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("metrics", metrics.metrics, name="metrics"),
]

handler404 = "console.views.not_found"
handler500 = "console.views.server_error"
