# accounts/views.py: the login lockout counted in the view, under the rules of "failed-login"
from django.contrib.auth import login
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.shortcuts import redirect, render

from django_throttle import check, refund


def login_view(request):
    form = AuthenticationForm(request, data=request.POST or None)
    if request.method == "POST":  # a GET shows the form: it is not an attempt
        # Count the attempt before it is made: parallel guesses cannot all get through.
        if not check(request, "failed-login").allowed:
            return HttpResponse("Too many failed logins: try again later.", status=429)
        if not form.is_valid():  # authenticate() found no user with this password
            return render(request, "registration/login.html", {"form": form}, status=401)
        refund(request, "failed-login")  # the right password: this attempt does not count
        login(request, form.get_user())
        return redirect("/")
    return render(request, "registration/login.html", {"form": form})
