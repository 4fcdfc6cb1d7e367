#!/usr/bin/env python3
"""Drives raccel's web console in headless Chromium (Selenium + chromedriver, Debian's
chromium-driver and python3-selenium), against a real scheduler that tests/web_test.cc
started with a known placement.

Checks:
  1. the block map shows every block of the pool, and the owner the scheduler reports on
     exactly the blocks it placed (--expect OWNER=FIRST-LAST, repeatable);
  2. an event appears live: --start runs a program, whose "admitted" event must show up
     in the page's event list without a reload;
  3. an action without the token is refused (the page says so, nothing changes); with the
     token it works (the vaccel is suspended, then resumed); a wrong token is refused;
  4. with --drain NODE: the page drains it, and then the page, the JSON API and the
     output of --during-drain (raccelctl nodes and pool, a refused program) all say the
     same: the node is draining, the pool's summary line is one text, the refusal says
     "not now" and "draining"; only Undrain is offered; numbers on the page are rounded.
Screenshots go to --artifacts. Prints one line per check; exits 1 on the first failure.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def api(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the scheduler's web console, e.g. http://127.0.0.1:7780")
    p.add_argument("--token", required=True, help="the operator's bearer token")
    p.add_argument("--expect", action="append", default=[], help="OWNER=FIRST-LAST: blocks the map must show as OWNER's")
    p.add_argument("--start", required=True, help="a command that starts a program (its admission must appear live)")
    p.add_argument("--started", required=True, help="the program name --start uses")
    p.add_argument("--preempt", required=True, type=int, help="a running vaccel's id to preempt and resume")
    p.add_argument("--artifacts", required=True, help="folder for the screenshots")
    p.add_argument("--drain", help="a node to drain from the page (check 4)")
    p.add_argument("--during-drain", help="a shell command run while it drains; its output is checked")
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()
    os.makedirs(args.artifacts, exist_ok=True)

    options = Options()
    options.binary_location = args.chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,1300"):
        options.add_argument(a)
    driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
    wait = WebDriverWait(driver, 30)
    try:
        driver.get(args.url + "/")
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")

        # 1. The block map.
        pool = api(args.url, "/api/pool")
        # Read in one go: the page redraws the map as events arrive.
        cells = driver.execute_script(
            "return [...document.querySelectorAll('#blockmap .block')].map(c => [Number(c.dataset.block), c.dataset.owner, "
            "c.classList.contains('used')]);")
        groups = driver.execute_script(
            "return [...document.querySelectorAll('#blockmap .node-group')].map(g => g.dataset.node);")
        if len(cells) != pool["blocks"]:
            fail("the map shows %d blocks, the pool has %d" % (len(cells), pool["blocks"]))
        expected = {}
        for e in args.expect:
            owner, span = e.rsplit("=", 1)
            first, last = (int(x) for x in span.split("-"))
            for b in range(first, last + 1):
                expected[b] = owner
        for b, owner, used in sorted(cells):
            want = expected.get(b, "")
            if owner != want or used != bool(want):
                fail("block %d shows owner %r (used: %s), expected %r" % (b, owner, used, want))
        nodes = sorted({r["node"] for r in pool["ranges"]})
        if sorted(groups) != nodes:
            fail("the map groups nodes %s, the pool has %s" % (groups, nodes))
        driver.save_screenshot(os.path.join(args.artifacts, "1-block-map.png"))
        print("block map: %d blocks in %d node group(s); owners as placed on %d block(s)" % (len(cells), len(groups), len(expected)),
              flush=True)

        # 2. An event appears live when a program starts.
        wait.until(lambda d: "live" in d.find_element(By.ID, "live").text)
        program = subprocess.Popen(shlex.split(args.start), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        selector = '#events li[data-kind="admitted"]'

        def admitted(d):
            return d.execute_script(
                "const li = [...document.querySelectorAll('%s')].find(e => e.dataset.subject.includes(arguments[0]));"
                "return li ? li.textContent : false;" % selector, args.started)
        started = time.time()
        text = WebDriverWait(driver, 30).until(admitted)
        print("live event: %r within %.1f s of starting the program, no reload" % (text, time.time() - started), flush=True)
        driver.save_screenshot(os.path.join(args.artifacts, "2-live-event.png"))
        program.wait(timeout=60)

        # 3. Actions: refused without the token, done with it, refused with a wrong one.
        def row_state(vaccel):
            return driver.execute_script(
                "const r = document.querySelector('#vaccels tr[data-id=\"%d\"]'); return r ? r.children[9].textContent : '';"
                % vaccel)

        def click_action(vaccel, action):
            selector = '#vaccels tr[data-id="%d"] button[data-action="%s"]' % (vaccel, action)
            WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: d.find_element(By.CSS_SELECTOR, selector).click() or True)

        def result_changed(before):
            return lambda d: d.find_element(By.ID, "action-result").text != before and d.find_element(By.ID, "action-result").text

        click_action(args.preempt, "preempt")
        text = wait.until(result_changed(""))
        if "refused" not in text or "401" not in text:
            fail("an action without the token was not refused: %r" % text)
        time.sleep(0.5)
        state = [v["state"] for v in api(args.url, "/api/vaccels")["vaccels"] if v["id"] == args.preempt]
        if state != ["running"]:
            fail("vaccel #%d changed without the token: %s" % (args.preempt, state))
        print("without the token: %r; vaccel #%d still running" % (text, args.preempt), flush=True)

        box = driver.find_element(By.ID, "token")
        box.clear()
        box.send_keys("not-the-token-at-all")
        driver.find_element(By.ID, "token-use").click()
        wait.until(lambda d: d.find_element(By.ID, "auth").text == "token refused")
        click_action(args.preempt, "preempt")
        text2 = wait.until(result_changed(text))
        if "refused" not in text2 or "401" not in text2:
            fail("an action with a wrong token was not refused: %r" % text2)
        print("with a wrong token: %r" % text2, flush=True)

        box.clear()
        box.send_keys(args.token)
        driver.find_element(By.ID, "token-use").click()
        wait.until(lambda d: d.find_element(By.ID, "auth").text == "token accepted")
        click_action(args.preempt, "preempt")
        text3 = wait.until(result_changed(text2))
        if not text3.startswith("preempt: "):
            fail("preempt with the token failed: %r" % text3)
        wait.until(lambda d: row_state(args.preempt) == "suspended")
        cell_owners = set(driver.execute_script(
            "return [...document.querySelectorAll('#blockmap .block')].map(c => c.dataset.owner);"))
        if any(o.endswith("#%d" % args.preempt) for o in cell_owners):
            fail("the suspended vaccel still shows on the block map")
        driver.save_screenshot(os.path.join(args.artifacts, "3-preempted-with-token.png"))
        print("with the token: %r; the row says suspended and its blocks are free on the map" % text3, flush=True)
        click_action(args.preempt, "resume")
        wait.until(lambda d: row_state(args.preempt) == "running")
        print("resumed with the token: %r" % driver.find_element(By.ID, "action-result").text, flush=True)
        driver.save_screenshot(os.path.join(args.artifacts, "4-resumed.png"))
        if args.drain:
            check_drain(driver, wait, args)
    finally:
        driver.quit()
    print("PASS", flush=True)


def check_drain(driver, wait, args):
    """Check 4: one state, told the same by the page, the API and raccelctl."""
    node = args.drain

    def node_cells(d):
        return d.execute_script(
            "const r = [...document.querySelectorAll('#nodes tbody tr')].find(r => r.dataset.node === arguments[0]);"
            "return r ? [r.children[1].textContent, [...r.querySelectorAll('button')].map(b => b.textContent)] : null;", node)

    if node_cells(driver) != ["online", ["Drain"]]:
        fail("before the drain, node %s's row shows %r (expected online, Drain only)" % (node, node_cells(driver)))
    WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.CSS_SELECTOR, '#nodes tr[data-node="%s"] button' % node).click() or True)
    wait.until(lambda d: node_cells(d) == ["draining", ["Undrain"]])
    # Settled: what ran there has moved or been suspended (the page's live event says so).
    WebDriverWait(driver, 60).until(lambda d: d.execute_script(
        "return [...document.querySelectorAll('#events li[data-kind=\"node-drained\"]')]"
        ".some(e => e.dataset.subject === arguments[0]);", node))
    pool = api(args.url, "/api/pool")
    nodes = {n["name"]: n for n in api(args.url, "/api/nodes")["nodes"]}
    if nodes[node]["state"] != "draining":
        fail("/api/nodes says %s is %r while the page says draining" % (node, nodes[node]["state"]))
    wait.until(lambda d: d.find_element(By.ID, "map-caption").text == "· " + api(args.url, "/api/pool")["summary"])
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#blockmap .block')].filter(c => c.dataset.node === arguments[0])"
        ".map(c => c.dataset.state);",
        node)
    if not cells or "free" in cells or "draining" not in cells and "used" not in cells:
        fail("the map shows node %s's blocks as %r during its drain" % (node, sorted(set(cells))))
    out = subprocess.run(args.during_drain, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120).stdout
    print(out, end="", flush=True)
    summary = api(args.url, "/api/pool")["summary"]
    if ("pool: " + summary) not in out:
        fail("raccelctl pool does not print the API's summary %r" % summary)
    rows = [l.split() for l in out.splitlines() if l.startswith(node + " ")]
    if not rows or rows[0][1] != "draining":
        fail("raccelctl nodes does not say %s is draining: %r" % (node, rows))
    if "not now" not in out or "draining" not in out.split("not now", 1)[1]:
        fail("the refusal during the drain does not say 'not now' and 'draining'")
    numbers = driver.execute_script(
        "return [...document.querySelectorAll('#cards tbody tr')].map(r => r.children[5].textContent)"
        ".concat([...document.querySelectorAll('#vms tbody tr')].map(r => r.children[2].textContent));")
    if not numbers or any(not re.fullmatch(r"\d+(\.\d{1,2})?", n) for n in numbers):
        fail("TFLOPS on the page are not rounded: %r" % numbers)
    driver.save_screenshot(os.path.join(args.artifacts, "5-draining.png"))
    print("drain of %s: page, /api/nodes, /api/pool and raccelctl agree (%s); TFLOPS shown as %s" %
          (node, summary, sorted(set(numbers))), flush=True)
    WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.CSS_SELECTOR, '#nodes tr[data-node="%s"] button' % node).click() or True)
    wait.until(lambda d: node_cells(d) == ["online", ["Drain"]])
    print("undrained from the page: %s online again" % node, flush=True)


if __name__ == "__main__":
    main()
