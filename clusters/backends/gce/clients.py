"""google-cloud clients for one endpoint and one set of credentials (REST transport)."""

from functools import cached_property

from django.conf import settings

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).


# The APIs called over plain REST (AuthorizedSession): each one's endpoint setting and Google's address.
REST_APIS = {
    "servicenetworking": ("GCE_SERVICE_NETWORKING_ENDPOINT", "https://servicenetworking.googleapis.com"),
    "resourcemanager": ("GCE_RESOURCE_MANAGER_ENDPOINT", "https://cloudresourcemanager.googleapis.com"),
    "storage": ("GCE_STORAGE_ENDPOINT", "https://storage.googleapis.com"),
    "serviceusage": ("GCE_SERVICE_USAGE_ENDPOINT", "https://serviceusage.googleapis.com"),
    "iam": ("GCE_IAM_ENDPOINT", "https://iam.googleapis.com"),
}


class Clients:
    """google-cloud clients sharing one endpoint and one set of credentials."""

    def __init__(self, endpoint, credentials_file):
        self.endpoint = endpoint
        self.credentials_file = credentials_file
        self.endpoints = {
            "filestore": settings.GCE_FILESTORE_ENDPOINT,
            "lustre": settings.GCE_LUSTRE_ENDPOINT,
            "secrets": settings.GCE_SECRET_MANAGER_ENDPOINT,
        }

    @cached_property
    def credentials(self):
        if self.endpoint and settings.GCE_ANONYMOUS:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        if self.credentials_file:
            from google.oauth2 import service_account

            return service_account.Credentials.from_service_account_file(
                self.credentials_file, scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        import google.auth

        credentials, _project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return credentials

    def make(self, cls, endpoint=""):
        endpoint = endpoint or self.endpoint
        options = {"api_endpoint": endpoint} if endpoint else None
        return cls(credentials=self.credentials, transport="rest", client_options=options)

    def __getattr__(self, name):
        from google.cloud import compute_v1, filestore_v1, lustre_v1, secretmanager_v1

        classes = {
            "networks": compute_v1.NetworksClient,
            "subnetworks": compute_v1.SubnetworksClient,
            "firewalls": compute_v1.FirewallsClient,
            "routers": compute_v1.RoutersClient,
            "addresses": compute_v1.GlobalAddressesClient,
            "templates": compute_v1.InstanceTemplatesClient,
            "images": compute_v1.ImagesClient,
            "policies": compute_v1.ResourcePoliciesClient,
            "instances": compute_v1.InstancesClient,
            "regions": compute_v1.RegionsClient,
            "reservations": compute_v1.ReservationsClient,
            "zone_operations": compute_v1.ZoneOperationsClient,
            "region_operations": compute_v1.RegionOperationsClient,
            "global_operations": compute_v1.GlobalOperationsClient,
            "filestore": filestore_v1.CloudFilestoreManagerClient,
            "lustre": lustre_v1.LustreClient,
            "secrets": secretmanager_v1.SecretManagerServiceClient,
        }
        if name not in classes:
            raise AttributeError(name)
        client = self.make(classes[name], self.endpoints.get(name, ""))
        setattr(self, name, client)
        return client

    def rest_url(self, api):
        """Where a REST-only API answers: its own setting, else the one endpoint every client uses (the
        tests' fake), else Google's."""
        setting, google = REST_APIS[api]
        return getattr(settings, setting) or self.endpoint or google

    def session(self):
        from google.auth.transport.requests import AuthorizedSession

        return AuthorizedSession(self.credentials)
