"""The web console in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium):
sign in, create a bucket, upload a 20 MiB file and a folder, browse, download and compare bytes, share a
link and fetch it, create a key and grant it one bucket, sign in as that key and see only that bucket,
delete everything; wrong credentials, an ended session and a forged CSRF token are refused.

With MOSAIC_CONSOLE_SCREENSHOTS=DIR, a screenshot of every page is saved there (docs/console/ holds them).
"""

import hashlib
import os
import shutil
import tempfile
import threading
import time

import pytest
import requests

from conftest import ACCESS_KEY, SECRET_KEY, Server

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

BUCKET = "console-e2e"
WAIT_S = 60


def chromium_paths():
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not browser or not os.path.exists(driver):
        pytest.fail("chromium and chromium-driver are needed (scripts/client-deps.sh installs them)")
    return browser, driver


@pytest.fixture()
def browser():
    binary, driver_path = chromium_paths()
    downloads = tempfile.mkdtemp(prefix="mosaic-console-downloads-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--disable-gpu", "--no-first-run", "--password-store=basic"]:
        opts.add_argument(arg)
    opts.add_experimental_option("prefs", {"download.default_directory": downloads,
                                           "download.prompt_for_download": False})
    d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver_path))
    d.downloads = downloads
    yield d
    d.quit()
    shutil.rmtree(downloads, ignore_errors=True)


def shot(d, name):
    where = os.environ.get("MOSAIC_CONSOLE_SCREENSHOTS")
    if where:
        os.makedirs(where, exist_ok=True)
        d.save_screenshot(os.path.join(where, name + ".png"))


def wait(d, condition, what):
    return WebDriverWait(d, WAIT_S, ignored_exceptions=[StaleElementReferenceException]).until(condition, what)


def text_in(d, css, text):
    return wait(d, ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text), f"{text!r} in {css}")


def sign_in(d, base, ak, sk):
    d.get(base + "/#/buckets")
    wait(d, ec.visibility_of_element_located((By.ID, "access-key")), "the sign-in form")
    for field, value in [("access-key", ak), ("secret-key", sk)]:
        d.find_element(By.ID, field).clear()
        d.find_element(By.ID, field).send_keys(value)
    d.find_element(By.ID, "signin-button").click()


def sign_out(d):
    d.find_element(By.ID, "signout").click()
    wait(d, ec.visibility_of_element_located((By.ID, "access-key")), "the sign-in form after signing out")


def page_is(d, title):
    text_in(d, "#title", title)


def accept_confirm(d, answer=None):
    alert = wait(d, ec.alert_is_present(), "a confirmation")
    if answer is not None:
        alert.send_keys(answer)
    alert.accept()


def message(d, text):
    text_in(d, "#message", text)


def rows(d, table):
    return [r.get_attribute("data-bucket") or r.get_attribute("data-key") or r.get_attribute("data-folder")
            for r in d.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]


def api_status(d, method, call, csrf):
    """A call made by the page's own origin with a chosen CSRF token; its HTTP status."""
    return d.execute_async_script(
        "const [m, c, t, done] = arguments;"
        "fetch('/console/api/' + c, {method: m, headers: {'x-mosaic-csrf': t}}).then(r => done(r.status));",
        method, call, csrf)


def requests_for_plots(s3, stop, most=3000):
    """Small PUTs and GETs until `stop` (at most `most`), so that the plots have something to show."""
    for i in range(most):
        if stop.is_set():
            break
        s3.put_object(Bucket=BUCKET, Key=f"plot/{i % 20}", Body=b"x" * 4096)
        s3.get_object(Bucket=BUCKET, Key=f"plot/{i % 20}")["Body"].read()
    for i in range(20):
        s3.delete_object(Bucket=BUCKET, Key=f"plot/{i}")


def test_the_console_end_to_end(server, s3, browser, tmp_path):
    d = browser
    base = "http://" + server.admin
    big = os.urandom(20 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    folder = tmp_path / "album"
    (folder / "inner").mkdir(parents=True)
    (folder / "one.txt").write_bytes(b"one")
    (folder / "inner" / "two.txt").write_bytes(b"two two")

    # Wrong credentials are refused with a readable reason.
    sign_in(d, base, ACCESS_KEY, "not the secret")
    message(d, "wrong")
    shot(d, "01-sign-in")
    sign_in(d, base, ACCESS_KEY, SECRET_KEY)
    page_is(d, "Buckets")

    # A forged CSRF token is refused, even from the page's own origin and session.
    assert api_status(d, "POST", "bucket?bucket=forged-csrf", "0" * 64) == 403

    # Create a bucket.
    d.find_element(By.ID, "new-bucket").send_keys(BUCKET)
    d.find_element(By.CSS_SELECTOR, "#create-bucket button").click()
    message(d, "created")
    wait(d, lambda d: BUCKET in rows(d, "buckets"), "the new bucket listed")
    assert "forged-csrf" not in rows(d, "buckets")
    shot(d, "02-buckets")

    # Upload a 20 MiB file (multipart, with a progress bar) and a folder.
    d.find_element(By.CSS_SELECTOR, f'tr[data-bucket="{BUCKET}"] a').click()
    page_is(d, "Objects")
    d.find_element(By.ID, "upload-files").send_keys(str(tmp_path / "big.bin"))
    text_in(d, "#upload-status", "Uploaded 1 file(s)")
    d.find_element(By.ID, "upload-folder").send_keys(str(folder))
    text_in(d, "#upload-status", "Uploaded 2 file(s)")
    wait(d, lambda d: {"big.bin", "album/"} <= set(rows(d, "objects")), "the file and the folder listed")
    shot(d, "03-objects")
    d.set_window_size(390, 844)  # a phone
    shot(d, "03-objects-phone")
    d.set_window_size(1280, 900)

    # Browse into the folder and its subfolder.
    d.find_element(By.CSS_SELECTOR, 'tr[data-folder="album/"] a').click()
    wait(d, lambda d: set(rows(d, "objects")) == {"album/inner/", "album/one.txt"}, "the folder's content")
    d.find_element(By.CSS_SELECTOR, 'tr[data-folder="album/inner/"] a').click()
    wait(d, lambda d: rows(d, "objects") == ["album/inner/two.txt"], "the subfolder's content")
    d.find_element(By.CSS_SELECTOR, f'.crumbs a[href="#/objects/{BUCKET}/"]').click()
    wait(d, lambda d: "big.bin" in rows(d, "objects"), "back at the bucket's top")

    # Search by prefix.
    d.find_element(By.ID, "search").send_keys("alb")
    d.find_element(By.CSS_SELECTOR, "#search-form button").click()
    wait(d, lambda d: rows(d, "objects") == ["album/"], "the search's result")
    d.find_element(By.ID, "search").clear()
    d.find_element(By.CSS_SELECTOR, "#search-form button").click()
    wait(d, lambda d: "big.bin" in rows(d, "objects"), "every object again")

    # Download: the file saved by the browser is the upload, byte for byte.
    d.find_element(By.XPATH, '//tr[@data-key="big.bin"]//button[text()="Download"]').click()
    saved = os.path.join(d.downloads, "big.bin")
    deadline = time.monotonic() + WAIT_S
    while not (os.path.exists(saved) and os.path.getsize(saved) == len(big)):
        assert time.monotonic() < deadline, "the download did not finish"
        time.sleep(0.1)
    with open(saved, "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(big).digest()
    d.get(base + f"/#/objects/{BUCKET}/")
    wait(d, lambda d: "big.bin" in rows(d, "objects"), "the bucket again")

    # Metadata and checksums.
    d.find_element(By.XPATH, '//tr[@data-key="big.bin"]//button[text()="Info"]').click()
    text_in(d, "#object-info", "content-length")
    shot(d, "04-object-info")
    d.find_element(By.CSS_SELECTOR, "#dialog form button").click()

    # Share a link and fetch it from outside the browser.
    d.find_element(By.CSS_SELECTOR, 'tr[data-folder="album/"] a').click()
    wait(d, lambda d: "album/one.txt" in rows(d, "objects"), "the folder")
    d.find_element(By.XPATH, '//tr[@data-key="album/one.txt"]//button[text()="Share"]').click()
    accept_confirm(d, "1")
    link = wait(d, ec.visibility_of_element_located((By.ID, "share-link")), "the share link").get_attribute("value")
    shot(d, "05-share-link")
    r = requests.get(link, timeout=30)
    assert r.status_code == 200 and r.content == b"one"
    d.find_element(By.CSS_SELECTOR, "#dialog form button").click()

    # A key granted this bucket only.
    d.get(base + "/#/keys")
    page_is(d, "Access keys")
    d.find_element(By.ID, "create-key").click()
    ak = wait(d, ec.visibility_of_element_located((By.ID, "new-access-key")), "the new key").text
    sk = d.find_element(By.ID, "new-secret-key").text
    shot(d, "06-new-key")
    d.find_element(By.CSS_SELECTOR, "#dialog form button").click()
    row = f'tr[data-key="{ak}"]'
    d.find_element(By.CSS_SELECTOR, row + " .grant-bucket").send_keys(BUCKET)
    Select(d.find_element(By.CSS_SELECTOR, row + " .grant-level")).select_by_value("read-write")
    d.find_element(By.CSS_SELECTOR, row + " form button").click()
    text_in(d, row, BUCKET + ": read-write")
    shot(d, "07-keys")

    # The other pages render (screenshots for the docs); the plots while some requests run.
    stop = threading.Event()
    traffic = threading.Thread(target=requests_for_plots, args=(s3, stop), daemon=True)
    traffic.start()
    try:
        for name, title in [("drives", "Drives"), ("cluster", "Cluster"), ("microstores", "Microstores"), ("metrics", "Metrics")]:
            d.get(base + "/#/" + name)
            page_is(d, title)
            if name == "metrics":
                # A line from the third sample on (the first is only a baseline).
                wait(d, lambda d: int(d.find_element(By.ID, "plot-rps").get_attribute("data-points") or 0) >= 2,
                     "a plot of the requests")
            shot(d, "08-" + name)
    finally:
        stop.set()
        traffic.join(timeout=60)

    # Signed in as that key: only that bucket, and no admin pages.
    sign_out(d)
    sign_in(d, base, ak, sk)
    page_is(d, "Buckets")
    wait(d, lambda d: rows(d, "buckets") == [BUCKET], "only the granted bucket")
    assert not d.find_element(By.CSS_SELECTOR, 'nav a[data-page="keys"]').is_displayed()

    # An ended session is refused: its cookie, kept from before signing out, no longer works.
    old = d.get_cookie("mosaic_console")
    assert old and old.get("httpOnly") and old.get("sameSite") == "Strict"
    sign_out(d)
    d.add_cookie({"name": old["name"], "value": old["value"], "path": "/"})
    d.get(base + "/#/buckets")
    wait(d, ec.visibility_of_element_located((By.ID, "access-key")), "sign-in, not the buckets")

    # Root deletes everything: objects (several at once), the bucket, the key.
    sign_in(d, base, ACCESS_KEY, SECRET_KEY)
    page_is(d, "Buckets")
    d.get(base + f"/#/objects/{BUCKET}/album/inner/")
    wait(d, lambda d: rows(d, "objects") == ["album/inner/two.txt"], "the subfolder")
    for c in d.find_elements(By.CSS_SELECTOR, "input.pick"):
        c.click()
    d.find_element(By.ID, "delete-selected").click()
    accept_confirm(d)
    message(d, "Deleted 1")
    d.get(base + f"/#/objects/{BUCKET}/album/")
    wait(d, lambda d: rows(d, "objects") == ["album/one.txt"], "the folder")
    d.find_element(By.CSS_SELECTOR, "input.pick").click()
    d.find_element(By.ID, "delete-selected").click()
    accept_confirm(d)
    message(d, "Deleted 1")
    d.get(base + "/#/buckets")
    page_is(d, "Buckets")
    wait(d, lambda d: BUCKET in rows(d, "buckets"), "the bucket")
    d.find_element(By.CSS_SELECTOR, f'tr[data-bucket="{BUCKET}"] button').click()
    accept_confirm(d)
    message(d, "not deleted")  # big.bin is still in it: refused, with the reason
    message(d, "BucketNotEmpty")
    d.get(base + f"/#/objects/{BUCKET}/")
    wait(d, lambda d: "big.bin" in rows(d, "objects"), "the last object")
    d.find_element(By.XPATH, '//tr[@data-key="big.bin"]//button[text()="Delete"]').click()
    accept_confirm(d)
    message(d, "Deleted 1")
    d.get(base + "/#/buckets")
    wait(d, lambda d: BUCKET in rows(d, "buckets"), "the bucket")
    d.find_element(By.CSS_SELECTOR, f'tr[data-bucket="{BUCKET}"] button').click()
    accept_confirm(d)
    message(d, "deleted")
    wait(d, lambda d: BUCKET not in rows(d, "buckets"), "the bucket gone")
    d.get(base + "/#/keys")
    page_is(d, "Access keys")
    d.find_element(By.CSS_SELECTOR, f'tr[data-key="{ak}"] button.danger').click()
    accept_confirm(d)
    message(d, "Key deleted")
    try:
        d.find_element(By.CSS_SELECTOR, f'tr[data-key="{ak}"]')
        raise AssertionError("the key is still listed")
    except NoSuchElementException:
        pass


def test_an_expired_session_is_refused(browser, tmp_path):
    """A server whose console sessions last 2 seconds: the page, used all along, returns to sign-in."""
    s = Server(str(tmp_path / "data"), extra_env={"MOSAIC_CONSOLE_SESSION_MAX_SECS": "2"})
    try:
        d = browser
        base = "http://" + s.admin
        signed_in = time.monotonic()  # before the server starts the session
        sign_in(d, base, ACCESS_KEY, SECRET_KEY)
        page_is(d, "Buckets")
        # Each visit asks the server again; once the session's age is past, the sign-in form is back
        # (a clock, not a synchronization).
        while True:
            d.get(base + "/#/buckets")
            d.refresh()
            # The page asks who is signed in, then shows the buckets or the sign-in form.
            wait(d, lambda d: d.find_element(By.ID, "signin").is_displayed() or d.find_elements(By.ID, "title"),
                 "the page's answer")
            if d.find_element(By.ID, "signin").is_displayed():
                break
            assert time.monotonic() - signed_in < 30, "the session outlived its age"
            time.sleep(0.2)
        assert time.monotonic() - signed_in >= 2
        wait(d, ec.visibility_of_element_located((By.ID, "access-key")), "the sign-in form")
    finally:
        assert s.stop() == 0
