# accounts/urls.py: include it in the project's urls.py, path("accounts/", include("accounts.urls")).
from django.contrib.auth.views import LoginView
from django.urls import path


class Login(LoginView):
    def form_invalid(self, form):
        response = super().form_invalid(form)
        response.status_code = 401  # a failed login: the rule counts it
        return response


urlpatterns = [path("login/", Login.as_view(), name="login")]
